// Whether a host answers: `AGENT HOST true` (ssh, or the agent mpirun
// uses), run with a deadline, as mpirun would reach the host to start its
// daemon there. Probes run side by side, each in a session of its own
// (no terminal: ssh cannot stop on a password prompt, a Ctrl-C in the
// terminal reaches only the launcher) and are killed, with whatever they
// started, past the deadline.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace cnnflow {

struct ProbeResult {
  bool answered = false;
  std::string why;  // when not: "ssh: connect to host b port 22: No route to host", ...
};

class HostProbes {
 public:
  HostProbes(std::vector<std::string> agent, double deadline_s);
  ~HostProbes();  // kills the probes still running
  HostProbes(const HostProbes&) = delete;
  HostProbes& operator=(const HostProbes&) = delete;

  // Starts probing `host` (nothing when a probe of it runs already).
  void Start(const std::string& host);
  // The probes that ended since the last call, by host; never blocks.
  std::map<std::string, ProbeResult> Poll();
  bool Running() const { return !running_.empty(); }
  // Kills the probes still running; their results are dropped.
  void Cancel();
  // Probes each of `hosts` and waits for them all (at most the deadline).
  std::map<std::string, ProbeResult> ProbeAll(const std::vector<std::string>& hosts);

 private:
  struct Probe {
    pid_t pid = 0;
    int out = -1;  // its stdout and stderr
    std::string text;
    std::chrono::steady_clock::time_point started;
  };
  std::vector<std::string> agent_;
  double deadline_s_;
  std::map<std::string, Probe> running_;
};

}  // namespace cnnflow
