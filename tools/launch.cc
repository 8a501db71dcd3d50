// Gang restart (`cnnflow launch`, `cnnflow train --max-restarts`).
//
// The design is torchrun's (torch.distributed.elastic's agent) and Horovod
// elastic's driver: a supervisor PROCESS outside the job, not a retry loop
// inside `cnnflow train`, because
//  - a rank killed by the kernel (SIGKILL, OOM, a segfault) cannot restart
//    itself, and under MPI the survivors cannot go on either: OpenMPI has no
//    fault-tolerant communicators (no ULFM), so a world that lost a rank is
//    dead and mpirun ends the job. Only a fresh mpirun gives a fresh world;
//  - as in torchrun, any failure restarts the WHOLE group (every rank, a new
//    mpirun), never one rank into a running job, and --max-restarts counts
//    those group restarts (torchrun's --max-restarts; N restarts = N + 1
//    attempts). Unlike torchrun, the user's script does not have to find its
//    own checkpoint: the launcher knows the run folder (--out RUN_DIR of the
//    train command) and restarts with `--resume RUN_DIR`, which takes the
//    newest valid checkpoint. Because resume is bitwise exact, a restarted
//    run ends as the uninterrupted one would have;
//  - a job that was asked to stop (Ctrl-C or SIGTERM to the launcher, or
//    the job exiting 130: "stopped by a signal, checkpoint written") is the
//    user's decision and is never restarted. Any other non-zero exit, or a
//    death by signal, is a failure and is restarted.
// What one attempt does (the child, the ranks' failure notes, a hung
// mpirun): tools/launch_attempt.cc. With hosts (--hosts, --hostfile,
// $SLURM_JOB_NODELIST) the job is elastic, over those of them that answer:
// tools/elastic_launch.cc.
#include "tools/launch.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "ops/error.h"
#include "pipeline/checkpoint.h"
#include "tools/command_line.h"
#include "tools/elastic_launch.h"
#include "tools/hosts.h"
#include "tools/launch_attempt.h"
#include "tools/launch_job.h"

namespace cnnflow {
namespace {

constexpr int64_t kDefaultMaxRestarts = 3;
// Before restarting a job the launcher had to end: a host did not answer,
// and a restart at once would fail to start its daemon there.
constexpr double kUnansweredRestartDelayS = 10;

// The fixed layout: COMMAND as given, every restart on the same hosts.
int Launch(int64_t max_restarts, const Job& job) {
  ForwardStopSignals();
  FailureChannel channel;
  std::vector<std::string> command = job.command;
  const int64_t attempts = max_restarts + 1;
  for (int64_t attempt = 1;; ++attempt) {
    channel.Take();           // what an earlier attempt's ranks wrote late
    if (StopSignal() != 0) {  // a stop between two attempts: none is started
      LaunchLog(
          StrCat("got signal ", StopSignal(), " before attempt ", attempt, ": not restarting"));
      return kStoppedExit;
    }
    LaunchLog(StrCat("attempt ", attempt, "/", attempts, ": ", Join(command)));
    const AttemptResult result = RunAttempt(command, channel);
    const int status = result.status;
    const bool ended = result.ended_by_launcher;  // a failure, whatever mpirun's status
    if (!ended && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      if (attempt > 1)
        LaunchLog(StrCat("attempt ", attempt, " finished after ", attempt - 1, " restart(s)"));
      return 0;
    }
    // Ended by the launcher: exit 1, whatever the signal did to mpirun (Open
    // MPI 4.1's crashes on a SIGTERM during an abort, SIGSEGV in PMIx_Finalize).
    const std::string what =
        ended ? StrCat("ended by the launcher after a rank on this host failed; mpirun ",
                       DescribeStatus(status))
              : DescribeStatus(status);
    const int code = ended ? 1 : ExitCode(status);
    if (StopSignal() != 0 || (!ended && WIFEXITED(status) && WEXITSTATUS(status) == kStoppedExit)) {
      LaunchLog(StrCat("attempt ", attempt, " was stopped (", what,
                       StopSignal() != 0 ? StrCat(", the launcher got signal ", StopSignal()) : "",
                       "): not restarting; continue with the same command and --resume ",
                       job.run_dir));
      return ExitCode(status);
    }
    std::vector<std::string> warnings;
    const std::optional<LoadedCheckpoint> ck = FindLatestCheckpoint(job.run_dir, &warnings);
    for (const auto& w : warnings) LaunchLog("checkpoint skipped: " + w);
    if (attempt == attempts) {
      LaunchLog(StrCat("giving up: attempt ", attempt, "/", attempts, " failed (", what,
                       ") and all ", max_restarts, " restart(s) of --max-restarts ", max_restarts,
                       " are used; ",
                       ck ? StrCat("the newest checkpoint (step ", ck->state.global_step,
                                   ") stays in ", job.run_dir, " for --resume")
                          : StrCat("no checkpoint in ", job.run_dir)));
      return code != 0 ? code : 1;
    }
    if (ended) {
      LaunchLog(StrCat("waiting ", kUnansweredRestartDelayS,
                       " s before the restart, for the host that did not answer"));
      SleepUnlessStopped(kUnansweredRestartDelayS);
    }
    command = JobCommand(job, ck.has_value());
    if (ck) {
      LaunchLog(StrCat("restart ", attempt, "/", max_restarts, ": attempt ", attempt, " failed (",
                       what, "); every rank resumes from checkpoint step ", ck->state.global_step,
                       " (epoch ", ck->state.epoch + 1, ", batch ", ck->state.batch_in_epoch, ", ",
                       ck->data_path, ")"));
    } else {
      LaunchLog(StrCat("restart ", attempt, "/", max_restarts, ": attempt ", attempt, " failed (",
                       what, "); no valid checkpoint in ", job.run_dir, " yet: starting over"));
    }
  }
}

bool UnderMpiOrSlurm() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

// The hosts of an elastic job: --hosts, --hostfile, or (with neither, no
// -n and COMMAND not an srun line) Slurm's allocation; none: a fixed job.
std::vector<Host> ChooseHosts(const std::string& hosts, const std::string& hostfile,
                              bool fixed_layout, bool from_slurm,
                              const std::vector<std::string>& command) {
  if (!hosts.empty() && !hostfile.empty()) {
    throw ConfigError("--hosts and --hostfile: give one of them");
  }
  if (!hosts.empty()) return ParseHostList(hosts);
  if (!hostfile.empty()) return ReadHostFile(hostfile);
  const char* slurm = std::getenv("SLURM_JOB_NODELIST");
  const bool srun = std::filesystem::path(command[0]).filename() == "srun";
  if (!from_slurm || fixed_layout || srun || slurm == nullptr || *slurm == '\0') return {};
  std::vector<Host> nodes;
  for (auto& n : ParseSlurmNodeList(slurm, "SLURM_JOB_NODELIST")) nodes.push_back({n, 0});
  LaunchLog(StrCat("hosts from $SLURM_JOB_NODELIST (", slurm, "): ", nodes.size(), " nodes"));
  return nodes;
}

int RunLaunchArgs(const std::vector<std::string>& args, bool from_slurm) {
  int64_t ranks = 0;
  ElasticOptions elastic;
  elastic.max_restarts = kDefaultMaxRestarts;
  std::string hosts, hostfile;
  std::vector<std::string> elastic_flags;  // given, for the error without hosts
  try {
    CommandLine cmd(args);
    std::vector<std::string> command;
    while (cmd.Next()) {
      if (cmd.Is("-h", "--help")) {
        std::printf("%s", kLaunchUsage);
        return 0;
      } else if (cmd.Is("--max-restarts")) {
        elastic.max_restarts = cmd.Count(0);
      } else if (cmd.Is("-n", "-np")) {
        ranks = cmd.Count(1);
      } else if (cmd.Is("--mpirun")) {
        elastic.mpirun = cmd.Value();
      } else if (cmd.Is("--hosts")) {
        hosts = cmd.Value();
      } else if (cmd.Is("--hostfile")) {
        hostfile = cmd.Value();
      } else if (cmd.Is("--min-hosts")) {
        elastic.min_hosts = cmd.Count(1);
      } else if (cmd.Is("--max-hosts")) {
        elastic.max_hosts = cmd.Count(1);
      } else if (cmd.Is("--procs-per-host")) {
        elastic.procs_per_host = cmd.Count(1);
      } else if (cmd.Is("--probe-every")) {
        elastic.probe_every_s = cmd.Seconds();
      } else if (cmd.Is("--join-timeout")) {
        elastic.join_timeout_s = cmd.Seconds();
      } else if (cmd.Is("--agent")) {
        elastic.agent = cmd.Value();
      } else if (cmd.Is("--")) {
        command = cmd.Rest();
        break;
      } else if (cmd.IsOption()) {
        cmd.Reject();
      } else {  // the command, without `--`
        command = cmd.Rest();
        command.insert(command.begin(), cmd.arg());
        break;
      }
      for (const char* flag : {"--min-hosts", "--max-hosts", "--procs-per-host", "--probe-every",
                               "--join-timeout", "--agent"}) {
        if (cmd.Is(flag)) elastic_flags.push_back(flag);
      }
    }
    if (command.empty())
      throw ConfigError("no command given (cnnflow launch ... -- cnnflow train ...)");
    if (ranks > 0 && (!hosts.empty() || !hostfile.empty())) {
      throw ConfigError(
          "-n and --hosts/--hostfile: with hosts the process count is hosts x "
          "--procs-per-host");
    }
    elastic.hosts = ChooseHosts(hosts, hostfile, ranks > 0, from_slurm, command);
    if (elastic.hosts.empty()) {
      if (!elastic_flags.empty()) {
        throw ConfigError(StrCat(elastic_flags.front(),
                                 " needs hosts: --hosts a,b,c or --hostfile FILE (or, under "
                                 "Slurm, $SLURM_JOB_NODELIST without -n)"));
      }
      if (ranks > 0) command.insert(command.begin(), {elastic.mpirun, "-n", std::to_string(ranks)});
      return Launch(elastic.max_restarts, ParseJob(command));
    }
    const auto n = static_cast<int64_t>(elastic.hosts.size());
    if (elastic.max_hosts == 0) elastic.max_hosts = n;
    if (elastic.max_hosts > n || elastic.min_hosts > elastic.max_hosts) {
      throw ConfigError(StrCat("--min-hosts ", elastic.min_hosts, " and --max-hosts ",
                               elastic.max_hosts, " do not fit ", n,
                               " hosts (1 <= min <= max <= hosts)"));
    }
    const Job job = ParseJob(command);
    CheckElasticCommand(job.command, job.train);
    return RunElastic(elastic, job);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "cnnflow launch: %s\n\n%s", e.what(), kLaunchUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cnnflow launch: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int RunLaunch(const std::vector<std::string>& args) { return RunLaunchArgs(args, true); }

void TellLauncherOfFailure(const std::string& line) {
  const char* path = std::getenv(kNotifyVar);
  if (path == nullptr || *path == '\0') return;
  // Never blocks, never creates: no launcher reading (or another host's
  // path) is no error.
  const int fd = open(path, O_WRONLY | O_NONBLOCK);
  if (fd < 0) return;
  struct stat st {};
  if (fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode)) {
    std::string one = line.substr(0, 1000);  // within PIPE_BUF: written whole
    std::replace(one.begin(), one.end(), '\n', ' ');
    one += '\n';
    [[maybe_unused]] const ssize_t n = write(fd, one.data(), one.size());
  }
  close(fd);
}

int RunTrainWithRestarts(const std::vector<std::string>& train_args) {
  if (UnderMpiOrSlurm()) {
    std::fprintf(stderr,
                 "cnnflow train: --max-restarts cannot relaunch the other ranks from inside "
                 "mpirun/srun; run the launcher around the job instead:\n  cnnflow launch "
                 "--max-restarts N -n RANKS -- cnnflow train ...\n");
    return 2;
  }
  std::vector<std::string> launch, train;
  for (size_t i = 0; i < train_args.size(); ++i) {
    if (train_args[i] == "--max-restarts" && i + 1 < train_args.size()) {
      launch = {"--max-restarts", train_args[++i]};
    } else if (train_args[i].rfind("--max-restarts=", 0) == 0) {
      launch = {"--max-restarts", train_args[i].substr(15)};
    } else {
      train.push_back(train_args[i]);
    }
  }
  std::error_code ec;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec || std::filesystem::path(self).filename().string().rfind("cnnflow", 0) != 0) {
    self = "cnnflow";
  }
  launch.push_back("--");
  launch.push_back(self);
  launch.push_back("train");
  launch.insert(launch.end(), train.begin(), train.end());
  return RunLaunchArgs(launch, false);  // one process here: never Slurm's nodes
}

}  // namespace cnnflow
