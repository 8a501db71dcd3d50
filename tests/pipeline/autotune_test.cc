// The autotuner against a simulated loader whose throughput is a known
// function of its knobs: it must climb to the best setting, undo moves that
// do not pay, give back threads that do not help, stay within bounds, and
// settle.
#include "pipeline/autotune.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

namespace cnnflow {
namespace {

struct Plant {
  std::vector<TunableKnob> knobs;
  std::function<double(int64_t threads, int64_t depth)> rate;  // images/s
  // > 0: a step of this rate consumes the batches (the run goes at the
  // slower of it and `rate`), and the tuner is told its busy time.
  double step_rate = 0;
  int64_t samples = 0;
  double seconds = 0, busy = 0;
  std::vector<AutotuneDecision> log;

  Plant(int64_t threads, int64_t max_threads, int64_t depth, int64_t max_depth) {
    knobs.push_back({"prefetch.depth", depth, 1, max_depth, true, nullptr});
    knobs.push_back({"load.threads", threads, 1, max_threads, false, nullptr});
    for (TunableKnob& k : knobs) k.set = [&k](int64_t v) { return std::clamp(v, k.min, k.max); };
  }
  int64_t depth() const { return knobs[0].value; }
  int64_t threads() const { return knobs[1].value; }
  // Runs batches of 64 samples at the current setting's rate.
  void Run(Autotuner& tuner, int64_t batches) {
    for (int64_t b = 0; b < batches && !tuner.settled(); ++b) {
      samples += 64;
      const double r = rate(threads(), depth());
      seconds += 64 / (step_rate > 0 ? std::min(r, step_rate) : r);
      if (step_rate > 0) busy += 64 / step_rate;
      for (auto& d : tuner.Observe(knobs, samples, seconds, step_rate > 0 ? busy : -1)) {
        log.push_back(d);
      }
    }
  }
  int Count(const std::string& action) const {
    int n = 0;
    for (const auto& d : log) n += d.action == action;
    return n;
  }
};

AutotuneOptions Fast() {
  AutotuneOptions o;
  o.window_batches = 4;
  o.window_seconds = 0;
  o.settle_batches = 1;
  return o;
}

TEST(Autotuner, ClimbsToTheBestSettingAndSettles) {
  // Decode-bound up to 3 threads; a depth under 4 starves the consumer.
  Plant p(/*threads=*/1, /*max_threads=*/4, /*depth=*/2, /*max_depth=*/16);
  p.rate = [](int64_t t, int64_t d) { return std::min(1000.0 * t, 2500.0) * (d >= 4 ? 1 : 0.8); };
  Autotuner tuner(Fast());
  p.Run(tuner, 1000);
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(p.threads(), 3);
  EXPECT_EQ(p.depth(), 4);
  EXPECT_EQ(tuner.values().at("load.threads"), 3);
  EXPECT_EQ(tuner.values().at("prefetch.depth"), 4);
  EXPECT_GE(p.Count("keep"), 3);    // depth 2->4, threads 1->2->3
  EXPECT_GE(p.Count("revert"), 2);  // threads 3->4 and depth 4->8 gain nothing
  EXPECT_EQ(p.Count("settled"), 1);
  EXPECT_NE(p.log.back().ToString().find("load.threads = 3"), std::string::npos)
      << p.log.back().ToString();
}

TEST(Autotuner, GivesBackThreadsThatDoNotHelp) {
  // The consumer bounds the run at 2,000 images/s: two decode threads suffice.
  Plant p(4, 4, 4, 4);
  p.rate = [](int64_t t, int64_t) { return std::min(1000.0 * t, 2000.0); };
  Autotuner tuner(Fast());
  p.Run(tuner, 1000);
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(p.threads(), 2);
}

TEST(Autotuner, KeepsEveryKnobWithinItsBounds) {
  Plant p(1, 2, 1, 8);
  p.rate = [](int64_t t, int64_t d) { return 100.0 * t * d; };  // always wants more
  Autotuner tuner(Fast());
  std::vector<TunableKnob>& k = p.knobs;
  for (int i = 0; i < 2000 && !tuner.settled(); ++i) {
    p.Run(tuner, 1);
    ASSERT_GE(k[0].value, 1);
    ASSERT_LE(k[0].value, 8);
    ASSERT_GE(k[1].value, 1);
    ASSERT_LE(k[1].value, 2);
  }
  EXPECT_TRUE(tuner.settled());
  EXPECT_EQ(p.threads(), 2);
  EXPECT_EQ(p.depth(), 8);
}

TEST(Autotuner, NoiseBelowTheGainDoesNotMoveAnything) {
  Plant p(2, 4, 4, 16);
  int64_t calls = 0;
  p.rate = [&calls](int64_t, int64_t) { return 1000.0 * (1 + 0.02 * ((++calls % 3) - 1)); };
  Autotuner tuner(Fast());
  p.Run(tuner, 2000);
  ASSERT_TRUE(tuner.settled());
  EXPECT_EQ(p.Count("keep") + p.Count("revert"), p.Count("try"));
  // Moves down lose under 3% here, so they may be kept; moves up never gain 5%.
  for (const auto& d : p.log) {
    if (d.action == "keep") {
      EXPECT_LT(d.to, d.from) << d.ToString();
    }
  }
}

// The run's own warm-up: every later window is faster, whatever the
// setting (here +100% over the first 600 batches, then flat). Each trial
// brackets its B window with A and A', so no move up is kept for a gain
// that is only the drift; before A/B/A trials, each "gained" 5-8%.
TEST(Autotuner, WarmUpDriftIsNotAGain) {
  Plant p(1, 4, 4, 16);
  const int64_t* samples = &p.samples;
  p.rate = [samples](int64_t, int64_t) {
    const double batches = static_cast<double>(*samples) / 64;
    return 500.0 * (1 + std::min(batches, 600.0) / 600);
  };
  Autotuner tuner(Fast());
  p.Run(tuner, 3000);
  ASSERT_TRUE(tuner.settled());
  ASSERT_GE(p.Count("try"), 2);
  for (const auto& d : p.log) {
    if (d.action == "keep") {
      EXPECT_LT(d.to, d.from) << "kept a move up for the drift: " << d.ToString();
    }
    if (d.action == "keep" || d.action == "revert") {
      EXPECT_NE(d.reason.find("A'"), std::string::npos) << d.reason;  // the evidence is logged
    }
  }
  EXPECT_EQ(p.threads(), 1);
}

// The step's busy time says which way to look. A step that never waits
// for data gets no move up tried (a decode thread would only take its
// core), and gives back what the loader does not need.
TEST(Autotuner, AStepThatNeverWaitsGetsNoMoveUpTried) {
  Plant p(2, 4, 4, 16);
  p.rate = [](int64_t t, int64_t) { return 3000.0 * t; };
  p.step_rate = 1000;
  Autotuner tuner(Fast());
  p.Run(tuner, 2000);
  ASSERT_TRUE(tuner.settled());
  ASSERT_GE(p.Count("try"), 2);
  for (const auto& d : p.log) {
    if (d.action == "try") {
      EXPECT_LT(d.to, d.from) << d.ToString();
      EXPECT_NE(d.reason.find("waiting for data 0%"), std::string::npos) << d.reason;
    }
  }
  EXPECT_EQ(p.threads(), 1);
  EXPECT_EQ(p.depth(), 1);
}

// A step that waits for data gets no move down tried: each would cost a
// window at a slower setting, for nothing.
TEST(Autotuner, AStepThatWaitsForDataGetsNoMoveDownTried) {
  Plant p(1, 4, 4, 16);
  p.rate = [](int64_t t, int64_t) { return 1000.0 * t; };
  p.step_rate = 5000;
  Autotuner tuner(Fast());
  p.Run(tuner, 2000);
  ASSERT_TRUE(tuner.settled());
  for (const auto& d : p.log) {
    if (d.action == "try") {
      EXPECT_GT(d.to, d.from) << d.ToString();
    }
  }
  EXPECT_EQ(p.threads(), 4);
  EXPECT_NE(p.log.back().reason.find("waiting for data"), std::string::npos) << p.log.back().reason;
}

}  // namespace
}  // namespace cnnflow
