#include "tools/launch_job.h"

#include <filesystem>
#include <sstream>

#include "ops/error.h"
#include "pipeline/checkpoint.h"

namespace cnnflow {
namespace {

std::string Base(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

bool IsMpirun(const std::string& word) {
  const std::string base = Base(word);
  return base == "mpirun" || base == "mpiexec" || base == "orterun";
}

}  // namespace

std::string Join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (const auto& a : v) s += (s.empty() ? "" : sep) + a;
  return s;
}

Job ParseJob(std::vector<std::string> command) {
  Job job;
  job.command = std::move(command);
  for (size_t i = 0; i + 1 < job.command.size(); ++i) {
    if (Base(job.command[i]).rfind("cnnflow", 0) == 0 && job.command[i + 1] == "train") {
      job.train = i + 1;
      break;
    }
  }
  if (job.train == 0) {
    throw ConfigError(
        StrCat("the command must run `cnnflow train` (possibly under mpirun or "
               "srun), got: ",
               Join(job.command)));
  }
  for (size_t i = job.train + 1; i + 1 < job.command.size(); ++i) {
    const std::string& a = job.command[i];
    if (a == "--out" || a == "-o" || a == "--resume") {
      job.dir_flag = i;
      job.run_dir = job.command[i + 1];
    }
  }
  if (job.run_dir.empty()) {
    throw ConfigError(
        "the train command needs --out RUN_DIR (or --resume RUN_DIR): a restart continues "
        "from that folder's newest checkpoint");
  }
  return job;
}

std::vector<std::string> JobCommand(const Job& job, bool resume) {
  std::vector<std::string> command = job.command;
  if (resume) command[job.dir_flag] = "--resume";
  return command;
}

std::string DescribeCheckpoint(const LoadedCheckpoint& ck) {
  return StrCat("step ", ck.state.global_step, " (epoch ", ck.state.epoch + 1, ", batch ",
                ck.state.batch_in_epoch, ")");
}

int64_t Layout::Processes() const {
  int64_t n = 0;
  for (const int64_t p : procs) n += p;
  return n;
}

std::string Layout::Describe() const {
  return StrCat(hosts.size(), hosts.size() == 1 ? " host (" : " hosts (", Join(hosts, ","), "; ",
                Processes(), Processes() == 1 ? " process)" : " processes)");
}

Layout MakeLayout(const std::vector<Host>& hosts, int64_t procs_per_host) {
  Layout layout;
  for (const Host& h : hosts) {
    layout.hosts.push_back(h.name);
    layout.procs.push_back(procs_per_host > 0 ? procs_per_host : h.slots > 0 ? h.slots : 1);
  }
  return layout;
}

void CheckElasticCommand(const std::vector<std::string>& command, size_t train) {
  if (train == 1) return;  // cnnflow train ...: the launcher's mpirun goes before it
  if (!IsMpirun(command[0])) {
    throw ConfigError(
        StrCat("with --hosts (--hostfile, $SLURM_JOB_NODELIST) the launcher places the ranks "
               "with mpirun: COMMAND must be `cnnflow train ...` or `mpirun ... cnnflow train "
               "...`, got '",
               command[0], "'"));
  }
  for (size_t i = 1; i + 1 < train; ++i) {
    const std::string& a = command[i];
    for (const char* chosen : {"--host", "-H", "-host", "--hostfile", "-hostfile", "--machinefile",
                               "-machinefile", "-n", "-np", "--np", "-c", "--n"}) {
      if (a == chosen || a.rfind(StrCat(chosen, "="), 0) == 0) {
        throw ConfigError(StrCat("the mpirun line sets '", a,
                                 "': with --hosts the launcher chooses the hosts and the "
                                 "process count (--procs-per-host); leave it out"));
      }
    }
  }
}

std::vector<std::string> MpirunLine(const std::vector<std::string>& command, size_t train,
                                    const std::string& mpirun, const Layout& layout) {
  std::vector<std::string> spec;
  for (size_t i = 0; i < layout.hosts.size(); ++i) {
    spec.push_back(StrCat(layout.hosts[i], ":", layout.procs[i]));
  }
  const std::vector<std::string> place = {"--host", Join(spec, ","), "-n",
                                          std::to_string(layout.Processes())};
  std::vector<std::string> line;
  if (train == 1) {
    line.push_back(mpirun);
  } else {
    line.push_back(command[0]);
  }
  line.insert(line.end(), place.begin(), place.end());
  line.insert(line.end(), command.begin() + (train == 1 ? 0 : 1), command.end());
  return line;
}

std::vector<std::string> RemoteAgent(const std::string& agent,
                                     const std::vector<std::string>& command, size_t train,
                                     const char* env_agent) {
  std::string chosen = agent;
  for (size_t i = 0; chosen.empty() && i + 2 < train; ++i) {
    const std::string& a = command[i];
    if ((a == "--mca" || a == "-mca" || a == "--gmca" || a == "-gmca") &&
        command[i + 1] == "plm_rsh_agent") {
      chosen = command[i + 2];
    }
  }
  if (chosen.empty() && env_agent != nullptr) chosen = env_agent;
  if (agent.empty()) chosen = chosen.substr(0, chosen.find(':'));  // Open MPI's "ssh : rsh"
  std::vector<std::string> argv;
  std::istringstream words(chosen);
  for (std::string w; words >> w;) argv.push_back(w);
  if (argv.empty()) argv.push_back("ssh");
  if (Base(argv[0]) == "ssh") argv.insert(argv.begin() + 1, {"-o", "BatchMode=yes"});
  return argv;
}

}  // namespace cnnflow
