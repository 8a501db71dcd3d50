#include "tools/host_probe.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ops/error.h"
#include "tools/launch_attempt.h"
#include "tools/launch_job.h"

extern char** environ;

namespace cnnflow {
namespace {

constexpr size_t kMaxOutput = 4096;  // of a probe's output, kept for its message

// The last non-empty line of `text`, for the reason a probe failed.
std::string LastLine(const std::string& text) {
  const size_t end = text.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return "";
  const size_t newline = text.rfind('\n', end);
  const size_t begin = newline == std::string::npos ? 0 : newline + 1;
  return text.substr(begin, end + 1 - begin);
}

void Drain(int fd, std::string& text) {
  char buf[1024];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) {
    if (text.size() < kMaxOutput) text.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace

HostProbes::HostProbes(std::vector<std::string> agent, double deadline_s)
    : agent_(std::move(agent)), deadline_s_(deadline_s) {}

HostProbes::~HostProbes() { Cancel(); }

void HostProbes::Start(const std::string& host) {
  if (running_.count(host) != 0) return;
  std::vector<std::string> args = agent_;
  args.push_back(host);
  args.push_back("true");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error(StrCat("pipe: ", std::strerror(errno)));
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&files, fds[1], 1);
  posix_spawn_file_actions_adddup2(&files, fds[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // A session of its own: no terminal to prompt on, and one group to kill.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  Probe probe;
  const int err = posix_spawnp(&probe.pid, argv[0], &files, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (err != 0) {
    close(fds[0]);
    throw Error(StrCat("cannot run the agent '", agent_[0], "' to probe host ", host, ": ",
                       std::strerror(err), " (--agent CMD)"));
  }
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  probe.out = fds[0];
  probe.started = std::chrono::steady_clock::now();
  running_[host] = std::move(probe);
}

std::map<std::string, ProbeResult> HostProbes::Poll() {
  std::map<std::string, ProbeResult> ended;
  for (auto it = running_.begin(); it != running_.end();) {
    Probe& p = it->second;
    Drain(p.out, p.text);
    int status = 0;
    pid_t got = waitpid(p.pid, &status, WNOHANG);
    const double age =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - p.started).count();
    ProbeResult r;
    if (got == 0 && age < deadline_s_) {
      ++it;
      continue;
    }
    if (got == 0) {  // past the deadline: the agent and all it started
      kill(-p.pid, SIGKILL);
      waitpid(p.pid, &status, 0);
      r.why = StrCat("no answer within ", deadline_s_, " s to `", Join(agent_), " ", it->first,
                     " true`");
    } else {
      Drain(p.out, p.text);
      r.answered = got == p.pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
      const std::string line = LastLine(p.text);
      if (!r.answered) r.why = line.empty() ? StrCat("probe ", DescribeStatus(status)) : line;
    }
    close(p.out);
    ended[it->first] = r;
    it = running_.erase(it);
  }
  return ended;
}

void HostProbes::Cancel() {
  for (auto& [host, p] : running_) {
    kill(-p.pid, SIGKILL);
    waitpid(p.pid, nullptr, 0);
    close(p.out);
  }
  running_.clear();
}

std::map<std::string, ProbeResult> HostProbes::ProbeAll(const std::vector<std::string>& hosts) {
  for (const auto& h : hosts) Start(h);
  std::map<std::string, ProbeResult> results;
  while (Running()) {
    usleep(50 * 1000);
    for (auto& [host, r] : Poll()) results[host] = r;
  }
  return results;
}

}  // namespace cnnflow
