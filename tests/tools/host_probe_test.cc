// Probes are real processes: an agent that answers, one that fails as ssh
// does for an unreachable host, and one that hangs past the deadline.
#include "tools/host_probe.h"

#include <gtest/gtest.h>

#include <chrono>

namespace cnnflow {
namespace {

// `sh -c SCRIPT` as the agent: the probe runs `sh -c SCRIPT HOST true`.
std::vector<std::string> Agent(const std::string& script) { return {"/bin/sh", "-c", script}; }

TEST(HostProbes, AnAgentThatExitsZeroAnswers) {
  HostProbes probes(Agent("exit 0"), 5);
  const auto results = probes.ProbeAll({"a", "b"});
  ASSERT_EQ(results.size(), 2u);
  EXPECT_TRUE(results.at("a").answered);
  EXPECT_TRUE(results.at("b").answered);
  EXPECT_EQ(results.at("a").why, "");
}

TEST(HostProbes, AFailureSaysWhyInTheAgentsLastLine) {
  // $0 is the host: the message names it, as ssh's does.
  HostProbes probes(
      Agent("echo noise; echo \"ssh: connect to host $0 port 22: No route to host\" >&2; exit 255"),
      5);
  const auto results = probes.ProbeAll({"far"});
  EXPECT_FALSE(results.at("far").answered);
  EXPECT_EQ(results.at("far").why, "ssh: connect to host far port 22: No route to host");
  HostProbes silent(Agent("exit 3"), 5);
  EXPECT_EQ(silent.ProbeAll({"x"}).at("x").why, "probe exit status 3");
}

TEST(HostProbes, AHungAgentIsKilledAtTheDeadline) {
  HostProbes probes(Agent("sleep 30"), 0.3);
  const auto begin = std::chrono::steady_clock::now();
  const auto results = probes.ProbeAll({"slow"});
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_LT(took, 5);
  EXPECT_FALSE(results.at("slow").answered);
  EXPECT_NE(results.at("slow").why.find("no answer within 0.3 s"), std::string::npos)
      << results.at("slow").why;
}

TEST(HostProbes, PollNeverBlocksAndCancelEndsTheProbes) {
  HostProbes probes(Agent("sleep 30"), 60);
  probes.Start("a");
  probes.Start("a");  // one probe a host
  EXPECT_TRUE(probes.Poll().empty());
  EXPECT_TRUE(probes.Running());
  probes.Cancel();
  EXPECT_FALSE(probes.Running());
}

}  // namespace
}  // namespace cnnflow
