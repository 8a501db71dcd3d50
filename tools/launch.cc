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
// A rank that fails on the launcher's host tells it so (TellLauncherOfFailure:
// a line into a FIFO named by $CNNFLOW_LAUNCH_NOTIFY, host-local by nature).
// mpirun then normally ends the job within a second; when it does not (a far
// host unreachable: mpirun waits on its orted until TCP gives up, ~15 min by
// default), the launcher ends mpirun itself after kFailureGraceS (SIGTERM,
// then SIGKILL), and only mpirun, its own child: processes on other hosts end
// on their own. So `cnnflow launch` exits within collective_timeout_s + a few
// seconds of a rank's failure. No Open MPI text is parsed.
// The job runs in its own process group with stdin from /dev/null, so a
// Ctrl-C in the terminal reaches it exactly once, through the launcher (a
// second signal would make cnnflow quit at once, without a checkpoint), and
// mpirun never stops on reading a terminal it does not own.
#include "tools/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "ops/error.h"
#include "pipeline/checkpoint.h"

extern char** environ;

namespace cnnflow {
namespace {

constexpr int64_t kDefaultMaxRestarts = 3;
constexpr int kStoppedExit = 130;  // cnnflow train: stopped by a signal, checkpoint written
constexpr const char* kNotifyVar = "CNNFLOW_LAUNCH_NOTIFY";
// After a rank on this host failed: how long mpirun has to end the job by
// itself (it takes well under a second when every host answers), and then
// between its SIGTERM and SIGKILL.
constexpr double kFailureGraceS = 3;
constexpr double kTermGraceS = 2;
// Before restarting a job the launcher had to end: a host did not answer,
// and a restart at once would fail to start its daemon there.
constexpr double kUnansweredRestartDelayS = 10;

volatile sig_atomic_t g_child = 0;  // the running attempt's pid (0 between attempts)
volatile sig_atomic_t g_stop = 0;   // the signal that asked the launcher to stop

extern "C" void ForwardStop(int sig) {
  g_stop = sig;
  if (g_child > 0) kill(static_cast<pid_t>(g_child), sig);
}

void Log(const std::string& line) { std::fprintf(stderr, "cnnflow launch: %s\n", line.c_str()); }

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& a : v) s += (s.empty() ? "" : " ") + a;
  return s;
}

// "exit status 1" or "killed by signal 9 (SIGKILL)".
std::string DescribeStatus(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    return StrCat("killed by signal ", sig, abbrev ? StrCat(" (SIG", abbrev, ")") : "");
  }
  return StrCat("exit status ", WEXITSTATUS(status));
}

// The shell's convention: a death by signal s is 128 + s.
int ExitCode(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

// The FIFO the ranks on this host tell of their failure through (read end,
// non-blocking; opened read-write so it never reads end-of-file), in a
// directory of its own that goes with the launcher.
class FailureChannel {
 public:
  FailureChannel() {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = StrCat(tmp && *tmp ? tmp : "/tmp", "/cnnflow-launch-XXXXXX");
    if (mkdtemp(dir.data()) == nullptr) return;  // no channel: mpirun ends the job alone
    dir_ = dir;
    path_ = dir_ + "/failures";
    if (mkfifo(path_.c_str(), 0600) == 0) fd_ = open(path_.c_str(), O_RDWR | O_NONBLOCK);
    if (fd_ >= 0) setenv(kNotifyVar, path_.c_str(), 1);
  }
  ~FailureChannel() {
    if (fd_ >= 0) close(fd_);
    if (!path_.empty()) unlink(path_.c_str());
    if (!dir_.empty()) rmdir(dir_.c_str());
  }
  int fd() const { return fd_; }
  // What the ranks wrote since the last call ("" for nothing).
  std::string Take() {
    std::string got;
    char buf[4096];
    ssize_t n;
    while (fd_ >= 0 && (n = read(fd_, buf, sizeof buf)) > 0)
      got.append(buf, static_cast<size_t>(n));
    return got;
  }

 private:
  std::string dir_, path_;
  int fd_ = -1;
};

FailureChannel* g_channel = nullptr;  // the launcher's, while it runs
bool g_ended_by_launcher = false;     // the last attempt's mpirun was ended by the launcher

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Waits for `pid` to end and returns its wait status. Once a rank on this
// host has written to the failure channel, mpirun gets kFailureGraceS to end
// the job; then it gets SIGTERM, and kTermGraceS later SIGKILL. Only mpirun
// (this launcher's child) is signalled, never its process group: its group
// may hold processes of other hosts (ssh's far ends do not, but a test's
// hosts that share one machine do).
int WaitForAttempt(pid_t pid) {
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> failed, termed;
  bool killed = false;
  g_ended_by_launcher = false;
  for (;;) {
    int status = 0;
    const pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid) return status;
    if (got < 0 && errno != EINTR) throw Error(StrCat("waitpid: ", std::strerror(errno)));
    pollfd p{g_channel ? g_channel->fd() : -1, POLLIN, 0};
    poll(&p, 1, 100);  // also the pace of the waitpid above
    const std::string news = g_channel ? g_channel->Take() : "";
    if (!news.empty() && !failed) {
      failed = Clock::now();
      std::string first = news.substr(0, news.find('\n'));
      if (first.size() > 300) first = first.substr(0, 300) + "...";
      Log(StrCat("a rank on this host failed (", first, "); the job has ", kFailureGraceS,
                 " s to end"));
    }
    if (failed && !termed && Seconds(*failed) >= kFailureGraceS) {
      termed = Clock::now();
      Log(StrCat("the job is still running ", kFailureGraceS,
                 " s after a rank failed (a host unreachable?): ending mpirun, the launcher's "
                 "child (SIGTERM, SIGKILL after ",
                 kTermGraceS, " s); the processes of other hosts end on their own"));
      kill(pid, SIGTERM);
      g_ended_by_launcher = true;
    }
    if (termed && !killed && Seconds(*termed) >= kTermGraceS) {
      killed = true;
      kill(pid, SIGKILL);
    }
  }
}

// Runs `command` to its end (its own process group, stdin /dev/null) and
// returns its wait status; throws when it cannot be started.
int RunAttempt(const std::vector<std::string>& command) {
  std::vector<char*> argv;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 0, "/dev/null", O_RDONLY, 0);
  // Blocked while the child starts, so a signal between spawn and g_child
  // is forwarded, not lost.
  sigset_t stops, old;
  sigemptyset(&stops);
  sigaddset(&stops, SIGINT);
  sigaddset(&stops, SIGTERM);
  sigprocmask(SIG_BLOCK, &stops, &old);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, argv[0], &files, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attr);
  if (err == 0) g_child = pid;
  const bool stop_pending = g_stop != 0;
  sigprocmask(SIG_SETMASK, &old, nullptr);
  if (err != 0) throw Error(StrCat("cannot run '", command[0], "': ", std::strerror(err)));
  if (stop_pending) kill(pid, g_stop);  // asked to stop before the child existed
  const int status = WaitForAttempt(pid);
  g_child = 0;
  return status;
}

struct Job {
  std::vector<std::string> command;
  size_t dir_flag = 0;  // index of --out/-o/--resume in command (0: none)
  std::string run_dir;
};

// Finds the `cnnflow train` in `command` and its run folder.
Job ParseJob(std::vector<std::string> command) {
  Job job;
  job.command = std::move(command);
  size_t train = 0;
  for (size_t i = 0; i + 1 < job.command.size(); ++i) {
    const std::string base = std::filesystem::path(job.command[i]).filename().string();
    if (base.rfind("cnnflow", 0) == 0 && job.command[i + 1] == "train") {
      train = i + 1;
      break;
    }
  }
  if (train == 0) {
    throw ConfigError(
        StrCat("the command must run `cnnflow train` (possibly under mpirun or "
               "srun), got: ",
               Join(job.command)));
  }
  for (size_t i = train + 1; i + 1 < job.command.size(); ++i) {
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

int64_t ParseCount(const std::string& flag, const std::string& v, int64_t min) {
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < min) {
    throw ConfigError(StrCat(flag, " needs a count >= ", min, ", got '", v, "'"));
  }
  return n;
}

int Launch(int64_t max_restarts, const Job& job) {
  struct sigaction sa {};
  sa.sa_handler = ForwardStop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  FailureChannel channel;
  g_channel = &channel;
  std::vector<std::string> command = job.command;
  const int64_t attempts = max_restarts + 1;
  for (int64_t attempt = 1;; ++attempt) {
    channel.Take();     // what an earlier attempt's ranks wrote late
    if (g_stop != 0) {  // a stop between two attempts: none is started
      Log(StrCat("got signal ", int(g_stop), " before attempt ", attempt, ": not restarting"));
      return kStoppedExit;
    }
    Log(StrCat("attempt ", attempt, "/", attempts, ": ", Join(command)));
    const int status = RunAttempt(command);
    const bool ended = g_ended_by_launcher;  // a failure, whatever mpirun's status
    if (!ended && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      if (attempt > 1)
        Log(StrCat("attempt ", attempt, " finished after ", attempt - 1, " restart(s)"));
      return 0;
    }
    // Ended by the launcher: exit 1, whatever the signal did to mpirun (Open
    // MPI 4.1's crashes on a SIGTERM during an abort, SIGSEGV in PMIx_Finalize).
    const std::string what =
        ended ? StrCat("ended by the launcher after a rank on this host failed; mpirun ",
                       DescribeStatus(status))
              : DescribeStatus(status);
    const int code = ended ? 1 : ExitCode(status);
    if (g_stop != 0 || (!ended && WIFEXITED(status) && WEXITSTATUS(status) == kStoppedExit)) {
      Log(StrCat("attempt ", attempt, " was stopped (", what,
                 g_stop != 0 ? StrCat(", the launcher got signal ", int(g_stop)) : "",
                 "): not restarting; continue with the same command and --resume ", job.run_dir));
      return ExitCode(status);
    }
    std::vector<std::string> warnings;
    const std::optional<LoadedCheckpoint> ck = FindLatestCheckpoint(job.run_dir, &warnings);
    for (const auto& w : warnings) Log("checkpoint skipped: " + w);
    if (attempt == attempts) {
      Log(StrCat("giving up: attempt ", attempt, "/", attempts, " failed (", what, ") and all ",
                 max_restarts, " restart(s) of --max-restarts ", max_restarts, " are used; ",
                 ck ? StrCat("the newest checkpoint (step ", ck->state.global_step, ") stays in ",
                             job.run_dir, " for --resume")
                    : StrCat("no checkpoint in ", job.run_dir)));
      return code != 0 ? code : 1;
    }
    if (ended) {
      Log(StrCat("waiting ", kUnansweredRestartDelayS,
                 " s before the restart, for the host that did not answer"));
      const auto begin = std::chrono::steady_clock::now();
      while (g_stop == 0 && Seconds(begin) < kUnansweredRestartDelayS) usleep(100 * 1000);
    }
    command = job.command;
    if (ck) {
      command[job.dir_flag] = "--resume";
      Log(StrCat("restart ", attempt, "/", max_restarts, ": attempt ", attempt, " failed (", what,
                 "); every rank resumes from checkpoint step ", ck->state.global_step, " (epoch ",
                 ck->state.epoch + 1, ", batch ", ck->state.batch_in_epoch, ", ", ck->data_path,
                 ")"));
    } else {
      Log(StrCat("restart ", attempt, "/", max_restarts, ": attempt ", attempt, " failed (", what,
                 "); no valid checkpoint in ", job.run_dir, " yet: starting over"));
    }
  }
}

bool UnderMpiOrSlurm() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

}  // namespace

int RunLaunch(const std::vector<std::string>& args) {
  int64_t max_restarts = kDefaultMaxRestarts, ranks = 0;
  std::string mpirun = "mpirun";
  std::vector<std::string> command;
  try {
    size_t i = 0;
    for (; i < args.size(); ++i) {
      const std::string& a = args[i];
      auto value = [&]() -> const std::string& {
        if (i + 1 >= args.size()) throw ConfigError(StrCat(a, " needs a value"));
        return args[++i];
      };
      if (a == "-h" || a == "--help") {
        std::printf("%s", kLaunchUsage);
        return 0;
      } else if (a == "--max-restarts") {
        max_restarts = ParseCount(a, value(), 0);
      } else if (a == "-n" || a == "-np") {
        ranks = ParseCount(a, value(), 1);
      } else if (a == "--mpirun") {
        mpirun = value();
      } else if (a == "--") {
        ++i;
        break;
      } else if (a.rfind("-", 0) == 0) {
        throw ConfigError(StrCat("unknown option '", a, "'"));
      } else {
        break;  // the command, without `--`
      }
    }
    command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
    if (command.empty())
      throw ConfigError("no command given (cnnflow launch ... -- cnnflow train ...)");
    if (ranks > 0) command.insert(command.begin(), {mpirun, "-n", std::to_string(ranks)});
    const Job job = ParseJob(command);
    return Launch(max_restarts, job);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "cnnflow launch: %s\n\n%s", e.what(), kLaunchUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cnnflow launch: error: %s\n", e.what());
    return 1;
  }
}

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
  return RunLaunch(launch);
}

}  // namespace cnnflow
