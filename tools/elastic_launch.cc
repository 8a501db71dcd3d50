// The elastic launcher's membership: which hosts answer, which are in use.
//
// Before the first attempt, and after every failed one, each host is probed
// (`AGENT HOST true` within kProbeDeadlineS, as mpirun reaches it); the
// attempt runs on the first --max-hosts of those that answer, in the order
// given, once at least --min-hosts do (waiting, probing every --probe-every
// s, up to --join-timeout s; then it gives up). While an attempt runs on
// fewer than --max-hosts, the hosts not in use are probed every
// --probe-every s; when one answers, the job is asked to stop after its
// current step with a checkpoint (SIGUSR1, see tools/launch_attempt.h) and
// starts again with that host. As in torchrun, a failure counts against
// --max-restarts (a lost host is one: the ranks fail their collective),
// and a grow does not: a host coming back is no fault of the job.
// The launcher's own host is not watched: the launcher runs there, and a
// job whose launcher died is over.
#include "tools/elastic_launch.h"

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>

#include "ops/error.h"
#include "pipeline/checkpoint.h"
#include "tools/host_probe.h"
#include "tools/launch_attempt.h"

namespace cnnflow {
namespace {

constexpr double kProbeDeadlineS = 10;

using Clock = std::chrono::steady_clock;
using Results = std::map<std::string, ProbeResult>;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// "host b" / "hosts b, c".
std::string HostsWord(const std::vector<std::string>& hosts) {
  return StrCat(hosts.size() == 1 ? "host " : "hosts ", Join(hosts, ", "));
}

// "host b lost (probe failed: why)" / "hosts b, c lost (probe failed: b: why; c: why)".
std::string DescribeHosts(const std::vector<std::string>& hosts, const std::string& verb,
                          const Results& results) {
  std::vector<std::string> whys;
  for (const auto& h : hosts) {
    const auto it = results.find(h);
    const std::string why = it == results.end() ? "" : it->second.why;
    if (!why.empty()) whys.push_back(hosts.size() == 1 ? why : StrCat(h, ": ", why));
  }
  return StrCat(HostsWord(hosts), " ", verb,
                whys.empty() ? "" : StrCat(" (probe failed: ", Join(whys, "; "), ")"));
}

class Elastic {
 public:
  Elastic(const ElasticOptions& o, const Job& job)
      : o_(o),
        job_(job),
        agent_(RemoteAgent(o.agent, job.command, job.train, std::getenv("OMPI_MCA_plm_rsh_agent"))),
        probes_(agent_, kProbeDeadlineS) {
    for (const auto& h : o.hosts) names_.push_back(h.name);
    max_hosts_ = o.max_hosts > 0 ? static_cast<size_t>(o.max_hosts) : names_.size();
  }

  int Run();

 private:
  bool InUse(const std::string& host) const {
    return std::find(in_use_.begin(), in_use_.end(), host) != in_use_.end();
  }

  // The hosts that answered, in the order given, at most max_hosts_.
  std::vector<std::string> Usable(const Results& results) const {
    std::vector<std::string> usable;
    for (const auto& h : names_) {
      const auto it = results.find(h);
      if (it != results.end() && it->second.answered && usable.size() < max_hosts_) {
        usable.push_back(h);
      }
    }
    return usable;
  }

  // The hosts that did not answer, in the order given.
  std::vector<std::string> Silent(const Results& results) const {
    std::vector<std::string> silent;
    for (const auto& h : names_) {
      const auto it = results.find(h);
      if (it == results.end() || !it->second.answered) silent.push_back(h);
    }
    return silent;
  }

  Layout LayoutOf(const std::vector<std::string>& hosts) const {
    std::vector<Host> chosen;
    for (const auto& h : o_.hosts) {
      if (std::find(hosts.begin(), hosts.end(), h.name) != hosts.end()) chosen.push_back(h);
    }
    return MakeLayout(chosen, o_.procs_per_host);
  }

  void ProbeLater() {
    next_probe_ =
        Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.probe_every_s * 1000));
  }

  // Probes every host until at least --min-hosts answer; nullopt when
  // --join-timeout passes first, or the launcher is asked to stop.
  std::optional<std::vector<std::string>> GatherHosts(Results& results);

  // While an attempt runs: probes the hosts not in use; true (once) when
  // one answers, to stop the job and grow it.
  bool WantGrow();

  // After a failed attempt: the hosts that answer now; false to give up.
  bool Shrink(int64_t attempt, const std::string& what, const std::string& from, int64_t restarts);

  // After the job stopped for a grow: the hosts in use with those joining.
  void Grow(int64_t attempt, const std::string& what, const std::string& from);

  // The first hosts; false to give up.
  bool Start();

  const ElasticOptions& o_;
  const Job& job_;
  std::vector<std::string> agent_;
  HostProbes probes_;
  FailureChannel channel_;
  std::vector<std::string> names_;
  size_t max_hosts_ = 0;
  std::vector<std::string> in_use_;
  std::set<std::string> ever_used_;
  std::vector<std::string> joining_;  // the hosts a grow adds
  Clock::time_point next_probe_;
};

std::optional<std::vector<std::string>> Elastic::GatherHosts(Results& results) {
  results = probes_.ProbeAll(names_);
  std::vector<std::string> usable = Usable(results);
  if (usable.size() >= static_cast<size_t>(o_.min_hosts)) return usable;
  LaunchLog(StrCat("only ", usable.size(), " of ", names_.size(), " hosts answer (",
                   usable.empty() ? "none" : Join(usable, ","), "; --min-hosts ", o_.min_hosts,
                   "): probing every ", o_.probe_every_s, " s for up to ", o_.join_timeout_s,
                   " s (--join-timeout)"));
  const auto begin = Clock::now();
  while (usable.size() < static_cast<size_t>(o_.min_hosts)) {
    const double left = o_.join_timeout_s - Seconds(begin);
    if (left <= 0 || StopSignal() != 0) return std::nullopt;
    SleepUnlessStopped(std::min(o_.probe_every_s, left));
    if (StopSignal() != 0) return std::nullopt;
    results = probes_.ProbeAll(names_);
    usable = Usable(results);
  }
  return usable;
}

bool Elastic::WantGrow() {
  if (in_use_.size() >= max_hosts_) return false;
  std::set<std::string> answered;
  for (const auto& [host, r] : probes_.Poll()) {
    if (r.answered) answered.insert(host);
  }
  if (!answered.empty()) {
    for (const auto& h : names_) {  // in the order given, up to max_hosts_
      if (answered.count(h) != 0 && in_use_.size() + joining_.size() < max_hosts_) {
        joining_.push_back(h);
      }
    }
    const bool again = std::all_of(joining_.begin(), joining_.end(),
                                   [&](const std::string& h) { return ever_used_.count(h) != 0; });
    LaunchLog(StrCat(HostsWord(joining_), joining_.size() == 1 ? " answers" : " answer",
                     again ? " again" : "", "; stopping after the current step to grow to ",
                     in_use_.size() + joining_.size(), " hosts"));
    return true;
  }
  if (!probes_.Running() && Clock::now() >= next_probe_) {
    for (const auto& h : names_) {
      if (!InUse(h)) probes_.Start(h);
    }
    ProbeLater();
  }
  return false;
}

bool Elastic::Shrink(int64_t attempt, const std::string& what, const std::string& from,
                     int64_t restarts) {
  Results results;
  const std::optional<std::vector<std::string>> usable = GatherHosts(results);
  if (!usable) {
    if (StopSignal() == 0) {
      LaunchLog(
          StrCat("giving up: attempt ", attempt, " failed (", what, ") and fewer than --min-hosts ",
                 o_.min_hosts, " hosts answered within ", o_.join_timeout_s,
                 " s (--join-timeout: ", DescribeHosts(Silent(results), "not answering", results),
                 "); the newest checkpoint stays in ", job_.run_dir, " for --resume"));
    }
    return false;
  }
  std::vector<std::string> lost, joined;
  for (const auto& h : in_use_) {
    if (std::find(usable->begin(), usable->end(), h) == usable->end()) lost.push_back(h);
  }
  for (const auto& h : *usable) {
    if (!InUse(h)) joined.push_back(h);
  }
  std::string change;
  if (!lost.empty()) change += DescribeHosts(lost, "lost", results) + "; ";
  if (!joined.empty()) change += HostsWord(joined) + (joined.size() == 1 ? " joins; " : " join; ");
  in_use_ = *usable;
  LaunchLog(StrCat(change, "restarting on ", LayoutOf(in_use_).Describe(), " ", from, ": restart ",
                   restarts, "/", o_.max_restarts, ", attempt ", attempt, " failed (", what, ")"));
  return true;
}

void Elastic::Grow(int64_t attempt, const std::string& what, const std::string& from) {
  std::vector<std::string> grown;
  for (const auto& h : names_) {
    if (InUse(h) || std::count(joining_.begin(), joining_.end(), h) != 0) grown.push_back(h);
  }
  in_use_ = grown;
  LaunchLog(StrCat(HostsWord(joining_), joining_.size() == 1 ? " joins" : " join",
                   "; restarting on ", LayoutOf(in_use_).Describe(), " ", from, " (attempt ",
                   attempt, " stopped: ", what, "; a grow, not counted against --max-restarts)"));
}

bool Elastic::Start() {
  LaunchLog(StrCat(names_.size(), names_.size() == 1 ? " host (" : " hosts (", Join(names_, ","),
                   "), ", o_.min_hosts, " to ", max_hosts_, " in use; probing each with `",
                   Join(agent_), " HOST true`"));
  Results results;
  const std::optional<std::vector<std::string>> first = GatherHosts(results);
  const std::vector<std::string> silent = Silent(results);
  if (!first) {
    if (StopSignal() == 0) {
      LaunchLog(StrCat("giving up: fewer than --min-hosts ", o_.min_hosts,
                       " hosts answered within ", o_.join_timeout_s, " s (--join-timeout: ",
                       DescribeHosts(silent, "not answering", results), ")"));
    }
    return false;
  }
  in_use_ = *first;
  if (!silent.empty()) {
    LaunchLog(StrCat(DescribeHosts(silent, "not answering", results), "; starting on ",
                     LayoutOf(in_use_).Describe()));
  }
  return true;
}

int Elastic::Run() {
  if (!Start()) return StopSignal() != 0 ? kStoppedExit : 1;
  bool resume = false;  // the command as given, until this job has a checkpoint
  int64_t restarts = 0;
  for (int64_t attempt = 1;; ++attempt) {
    if (StopSignal() != 0) {
      LaunchLog(
          StrCat("got signal ", StopSignal(), " before attempt ", attempt, ": not restarting"));
      return kStoppedExit;
    }
    const Layout layout = LayoutOf(in_use_);
    ever_used_.insert(in_use_.begin(), in_use_.end());
    const std::vector<std::string> command =
        MpirunLine(JobCommand(job_, resume), job_.train, o_.mpirun, layout);
    LaunchLog(StrCat("attempt ", attempt, " on ", layout.Describe(), ": ", Join(command)));
    channel_.Take();  // what an earlier attempt's ranks wrote late
    joining_.clear();
    ProbeLater();
    const AttemptResult r = RunAttempt(command, channel_, [this] { return WantGrow(); });
    probes_.Cancel();
    const int status = r.status;
    if (!r.ended_by_launcher && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      LaunchLog(StrCat("attempt ", attempt, " finished on ", layout.Describe(), "; ", restarts,
                       " restart(s) of --max-restarts ", o_.max_restarts, " used"));
      return 0;
    }
    const std::string what =
        r.ended_by_launcher
            ? StrCat("ended by the launcher after a rank on this host failed; mpirun ",
                     DescribeStatus(status))
            : DescribeStatus(status);
    const bool stopped = WIFEXITED(status) && WEXITSTATUS(status) == kStoppedExit;
    if (StopSignal() != 0 || (stopped && !r.stopped_by_launcher)) {
      LaunchLog(StrCat("attempt ", attempt, " was stopped (", what,
                       StopSignal() != 0 ? StrCat(", the launcher got signal ", StopSignal()) : "",
                       "): not restarting; continue with the same command and --resume ",
                       job_.run_dir));
      return ExitCode(status);
    }
    std::vector<std::string> warnings;
    const std::optional<LoadedCheckpoint> ck = FindLatestCheckpoint(job_.run_dir, &warnings);
    for (const auto& w : warnings) LaunchLog("checkpoint skipped: " + w);
    resume = resume || ck.has_value();
    const std::string from =
        ck ? StrCat("from checkpoint ", DescribeCheckpoint(*ck))
           : StrCat("from the start (no valid checkpoint in ", job_.run_dir, " yet)");
    if (r.stopped_by_launcher && !r.ended_by_launcher) {
      Grow(attempt, what, from);
      continue;
    }
    if (restarts == o_.max_restarts) {
      LaunchLog(StrCat("giving up: attempt ", attempt, " failed (", what, ") and all ",
                       o_.max_restarts, " restart(s) of --max-restarts ", o_.max_restarts,
                       " are used; ",
                       ck ? StrCat("the newest checkpoint (step ", ck->state.global_step,
                                   ") stays in ", job_.run_dir, " for --resume")
                          : StrCat("no checkpoint in ", job_.run_dir)));
      return r.ended_by_launcher || ExitCode(status) == 0 ? 1 : ExitCode(status);
    }
    ++restarts;
    if (!Shrink(attempt, what, from, restarts)) return StopSignal() != 0 ? kStoppedExit : 1;
  }
}

}  // namespace

int RunElastic(const ElasticOptions& options, const Job& job) {
  ForwardStopSignals();
  return Elastic(options, job).Run();
}

}  // namespace cnnflow
