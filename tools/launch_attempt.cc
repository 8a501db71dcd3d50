// The attempt's child and its end (see tools/launch.cc for the design).
//
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
#include "tools/launch_attempt.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "ops/error.h"
#include "tools/signals.h"

extern char** environ;

namespace cnnflow {
namespace {

// After a rank on this host failed: how long mpirun has to end the job by
// itself (it takes well under a second when every host answers), and then
// between its SIGTERM and SIGKILL.
constexpr double kFailureGraceS = 3;
constexpr double kTermGraceS = 2;
// After the launcher asked the job to stop (to grow it): how long the ranks
// have to finish the step and write the checkpoint before mpirun is killed.
constexpr double kStopGraceS = 60;

volatile sig_atomic_t g_child = 0;  // the running attempt's pid (0 between attempts)
volatile sig_atomic_t g_stop = 0;   // the signal that asked the launcher to stop

// The first Ctrl-C or SIGTERM goes on as SIGUSR1: Open MPI's mpirun passes
// it to every rank and waits (a SIGTERM it passes on, then SIGKILLs the
// ranks a second later, before a step and its checkpoint are done), and
// `cnnflow train` stops after the step on it as on SIGTERM. A second one
// goes on as itself: end the job now.
extern "C" void ForwardStop(int sig) {
  const bool again = g_stop != 0;
  g_stop = sig;
  if (g_child > 0) kill(static_cast<pid_t>(g_child), again ? sig : SIGUSR1);
}

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Waits for `pid` to end. Once a rank on this host has written to the
// failure channel, mpirun gets kFailureGraceS to end the job; then it gets
// SIGTERM, and kTermGraceS later SIGKILL. Only mpirun (this launcher's
// child) is signalled, never its process group: its group may hold
// processes of other hosts (ssh's far ends do not, but a test's hosts that
// share one machine do).
AttemptResult WaitForAttempt(pid_t pid, FailureChannel& channel, const WantStop& want_stop) {
  AttemptResult result;
  std::optional<Clock::time_point> failed, termed, stop_asked;
  bool killed = false;
  for (;;) {
    const pid_t got = waitpid(pid, &result.status, WNOHANG);
    if (got == pid) return result;
    if (got < 0 && errno != EINTR) throw Error(StrCat("waitpid: ", std::strerror(errno)));
    pollfd p{channel.fd(), POLLIN, 0};
    poll(&p, 1, 100);  // also the pace of the waitpid above
    const std::string news = channel.Take();
    if (!news.empty() && !failed) {
      failed = Clock::now();
      std::string first = news.substr(0, news.find('\n'));
      if (first.size() > 300) first = first.substr(0, 300) + "...";
      LaunchLog(StrCat("a rank on this host failed (", first, "); the job has ", kFailureGraceS,
                       " s to end"));
    }
    if (failed && !termed && Seconds(*failed) >= kFailureGraceS) {
      termed = Clock::now();
      LaunchLog(StrCat("the job is still running ", kFailureGraceS,
                       " s after a rank failed (a host unreachable?): ending mpirun, the "
                       "launcher's child (SIGTERM, SIGKILL after ",
                       kTermGraceS, " s); the processes of other hosts end on their own"));
      kill(pid, SIGTERM);
      result.ended_by_launcher = true;
    }
    if (termed && !killed && Seconds(*termed) >= kTermGraceS) {
      killed = true;
      kill(pid, SIGKILL);
    }
    // The launcher's own stop: SIGUSR1, which mpirun passes on to every
    // rank (a SIGTERM it would follow with a SIGKILL 1 s later); the ranks
    // agree on the step to stop after, rank 0 checkpoints, all exit 130.
    if (!failed && !stop_asked && g_stop == 0 && want_stop && want_stop()) {
      stop_asked = Clock::now();
      result.stopped_by_launcher = true;
      kill(pid, SIGUSR1);
    }
    if (stop_asked && !killed && Seconds(*stop_asked) >= kStopGraceS) {
      killed = true;
      LaunchLog(StrCat("the job did not stop within ", kStopGraceS, " s: killing mpirun"));
      kill(pid, SIGKILL);
    }
  }
}

}  // namespace

void LaunchLog(const std::string& line) {
  std::fprintf(stderr, "cnnflow launch: %s\n", line.c_str());
}

std::string DescribeStatus(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    return StrCat("killed by signal ", sig, abbrev ? StrCat(" (SIG", abbrev, ")") : "");
  }
  return StrCat("exit status ", WEXITSTATUS(status));
}

int ExitCode(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

void ForwardStopSignals() { HandleSignals(ForwardStop, {SIGINT, SIGTERM}); }

int StopSignal() { return g_stop; }

FailureChannel::FailureChannel() {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = StrCat(tmp && *tmp ? tmp : "/tmp", "/cnnflow-launch-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) return;  // no channel: mpirun ends the job alone
  dir_ = dir;
  path_ = dir_ + "/failures";
  // Read-write, so that it never reads end-of-file.
  if (mkfifo(path_.c_str(), 0600) == 0) fd_ = open(path_.c_str(), O_RDWR | O_NONBLOCK);
  if (fd_ >= 0) setenv(kNotifyVar, path_.c_str(), 1);
}

FailureChannel::~FailureChannel() {
  if (fd_ >= 0) close(fd_);
  if (!path_.empty()) unlink(path_.c_str());
  if (!dir_.empty()) rmdir(dir_.c_str());
}

std::string FailureChannel::Take() {
  std::string got;
  char buf[4096];
  ssize_t n;
  while (fd_ >= 0 && (n = read(fd_, buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(n));
  return got;
}

AttemptResult RunAttempt(const std::vector<std::string>& command, FailureChannel& channel,
                         const WantStop& want_stop) {
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
  const AttemptResult result = WaitForAttempt(pid, channel, want_stop);
  g_child = 0;
  return result;
}

void SleepUnlessStopped(double seconds) {
  const auto begin = Clock::now();
  while (g_stop == 0 && Seconds(begin) < seconds) usleep(100 * 1000);
}

}  // namespace cnnflow
