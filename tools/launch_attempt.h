// One attempt of a `cnnflow launch` job: the child (mpirun, or the train
// command itself) started in its own process group, the launcher's
// Ctrl-C/SIGTERM passed on to it once, the ranks' failure notes read from a
// FIFO, a hung mpirun ended, and a stop asked for by the launcher itself
// (to grow the job onto a host that came back). tools/launch.cc decides
// what runs and whether to restart.
#pragma once

#include <csignal>
#include <functional>
#include <string>
#include <vector>

namespace cnnflow {

inline constexpr int kStoppedExit = 130;  // cnnflow train: stopped by a signal, checkpoint written
inline constexpr const char* kNotifyVar = "CNNFLOW_LAUNCH_NOTIFY";

// One line on stderr, "cnnflow launch: LINE".
void LaunchLog(const std::string& line);

// "exit status 1" or "killed by signal 9 (SIGKILL)".
std::string DescribeStatus(int status);

// The shell's convention: a death by signal s is 128 + s.
int ExitCode(int status);

// SIGINT and SIGTERM to the launcher are passed on to the running attempt
// (once each) and remembered: StopSignal() is then that signal, else 0.
void ForwardStopSignals();
int StopSignal();

// The FIFO the ranks on this host tell of their failure through, in a
// directory of its own that goes with it; sets $CNNFLOW_LAUNCH_NOTIFY.
class FailureChannel {
 public:
  FailureChannel();
  ~FailureChannel();
  FailureChannel(const FailureChannel&) = delete;
  FailureChannel& operator=(const FailureChannel&) = delete;
  int fd() const { return fd_; }
  // What the ranks wrote since the last call ("" for nothing).
  std::string Take();

 private:
  std::string dir_, path_;
  int fd_ = -1;
};

struct AttemptResult {
  int status = 0;                    // waitpid's
  bool ended_by_launcher = false;    // a rank here failed and the launcher ended mpirun
  bool stopped_by_launcher = false;  // want_stop said so and the job was asked to stop
};

// Called about every 100 ms while an attempt runs: true asks the job to
// stop after its current step with a checkpoint (SIGUSR1 to the child, which
// mpirun passes on to every rank; once).
using WantStop = std::function<bool()>;

// Runs `command` to its end (its own process group, stdin /dev/null).
// Throws Error when it cannot be started.
AttemptResult RunAttempt(const std::vector<std::string>& command, FailureChannel& channel,
                         const WantStop& want_stop = nullptr);

// Sleeps `seconds`, or less when the launcher is asked to stop.
void SleepUnlessStopped(double seconds);

}  // namespace cnnflow
