// Each rank's step phases and the straggler's name (pipeline/rank_times.h):
// the rule on tables of per-rank figures, two ranks and many, healthy noise
// and one slow phase.
#include "pipeline/rank_times.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace cnnflow {
namespace {

// ms per step: data, forward, backward, all-reduce, optimizer.
RankPhases Rank(int rank, double data, double forward, double backward, double allreduce,
                double optimizer) {
  return RankPhases{rank, {data, forward, backward, allreduce, optimizer}};
}

TEST(StallWarning, FollowsTheMedianStepWhereThatIsLonger) {
  // Steps of 2, 4 and 30 s (all five phases): the median is 4 s.
  const std::vector<RankPhases> slow = {Rank(0, 100, 500, 1000, 300, 100),
                                        Rank(1, 100, 1000, 2000, 800, 100),
                                        Rank(2, 100, 9000, 20000, 800, 100)};
  EXPECT_DOUBLE_EQ(MedianStepMs(slow), 4000);
  EXPECT_DOUBLE_EQ(StallWarnSeconds(10, slow), 12);  // 3 steps of 4 s
  EXPECT_DOUBLE_EQ(StallWarnSeconds(20, slow), 20);  // the configured floor
  EXPECT_DOUBLE_EQ(StallWarnSeconds(0, slow), 0);    // off stays off
  // Steps of 20 ms: the configured 10 s.
  const std::vector<RankPhases> fast = {Rank(0, 1, 5, 10, 3, 1), Rank(1, 1, 5, 10, 3, 1)};
  EXPECT_DOUBLE_EQ(MedianStepMs(fast), 20);
  EXPECT_DOUBLE_EQ(StallWarnSeconds(10, fast), 10);
  EXPECT_DOUBLE_EQ(MedianStepMs({}), 0);
}

TEST(Straggler, NoneWithOneRankOrNone) {
  EXPECT_FALSE(FindStraggler({}));
  EXPECT_FALSE(FindStraggler({Rank(0, 0.2, 3, 5, 0, 0.5)}));
}

TEST(Straggler, NoneWhenAllAreEqual) {
  std::vector<RankPhases> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(Rank(r, 0.2, 3, 5, 0.4, 0.5));
  EXPECT_FALSE(FindStraggler(ranks));
  ranks.resize(2);
  EXPECT_FALSE(FindStraggler(ranks));
}

TEST(Straggler, TwoRanksTheSlowOneIsMeasuredAgainstTheOther) {
  // Rank 1's backward takes 40 ms more; rank 0 waits for it in the all-reduce.
  const std::vector<RankPhases> ranks = {Rank(0, 0.2, 3, 5, 40.5, 0.5),
                                         Rank(1, 0.2, 3, 45, 0.5, 0.5)};
  const auto s = FindStraggler(ranks);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->rank, 1);
  EXPECT_EQ(s->phase, "backward");
  EXPECT_DOUBLE_EQ(s->ms, 45);
  EXPECT_DOUBLE_EQ(s->others_ms, 5);  // the other rank's, not the mean of both (25)
  EXPECT_EQ(s->Line(),
            "rank 1 is the straggler: its backward takes 9.0x the other rank's "
            "(45.0 vs 5.0 ms per step)");
}

TEST(Straggler, NoneInHealthyNoiseBetweenTwoRanks) {
  // A loaded machine: one rank 30% slower in each phase, waits crossed.
  EXPECT_FALSE(FindStraggler({Rank(0, 0.3, 3, 5, 2.0, 0.5), Rank(1, 0.2, 3.9, 6.5, 0.4, 0.65)}));
  EXPECT_FALSE(FindStraggler({Rank(0, 0.2, 3.9, 6.5, 0.4, 0.65), Rank(1, 0.3, 3, 5, 2.0, 0.5)}));
}

TEST(Straggler, OneRankSlowInOnePhaseOnly) {
  // Rank 2's optimizer step takes 10 ms instead of 0.5; the others wait for
  // it (in the stop agreement after the step, counted as all-reduce).
  const std::vector<RankPhases> ranks = {
      Rank(0, 0.2, 3, 5, 10, 0.5), Rank(1, 0.2, 3.1, 5.1, 9.8, 0.5), Rank(2, 0.2, 3, 5, 0.3, 10),
      Rank(3, 0.2, 2.9, 4.9, 10.1, 0.5)};
  const auto s = FindStraggler(ranks);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->rank, 2);
  EXPECT_EQ(s->phase, "optimizer");
  EXPECT_EQ(s->Line(),
            "rank 2 is the straggler: its optimizer takes 20.0x the median of the other 3 "
            "ranks (10.0 vs 0.5 ms per step)");
}

TEST(Straggler, NoneWhenNobodyWaitsForIt) {
  // Rank 1's backward is twice rank 0's, yet rank 0 does not wait on it in
  // the all-reduce (it waited as long for its data): it holds nobody up.
  EXPECT_FALSE(FindStraggler({Rank(0, 5, 3, 5, 0.5, 0.5), Rank(1, 0.2, 3, 10, 0.5, 0.5)}));
}

TEST(Straggler, NoneWhenASmallPhaseDoubles) {
  // 0.3 ms against 0.1 ms of a 10 ms step: under kStragglerShare.
  EXPECT_FALSE(FindStraggler({Rank(0, 0.2, 3, 6, 0.9, 0.1), Rank(1, 0.2, 3, 6, 0.7, 0.3)}));
}

TEST(Straggler, ComputeAsAWholeWhenNoSinglePhaseIsEnough) {
  // Rank 1 takes twice as long in forward, backward and optimizer, 1 ms
  // more in each: none of them alone is 10% of the 16 ms step, the three
  // together are.
  const auto s = FindStraggler({Rank(0, 10, 1, 1, 3, 1), Rank(1, 10, 2, 2, 0, 2)});
  ASSERT_TRUE(s);
  EXPECT_EQ(s->rank, 1);
  EXPECT_EQ(s->phase, "compute (forward+backward+optimizer)");
  EXPECT_DOUBLE_EQ(s->ms, 6);
  EXPECT_DOUBLE_EQ(s->others_ms, 3);
}

TEST(Straggler, TheSlowerOfTwoSlowRanks) {
  const std::vector<RankPhases> ranks = {Rank(0, 0.2, 3, 5, 30, 0.5), Rank(1, 0.2, 3, 20, 15, 0.5),
                                         Rank(2, 0.2, 3, 35, 0.2, 0.5), Rank(3, 0.2, 3, 5, 30, 0.5),
                                         Rank(4, 0.2, 3, 5, 30, 0.5)};
  const auto s = FindStraggler(ranks);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->rank, 2);
  EXPECT_EQ(s->phase, "backward");
}

TEST(SlowStage, TheBusiestStageAgainstTheOthersMedian) {
  const std::vector<std::vector<std::string>> layers = {
      {"conv1", "pool1"}, {"conv2"}, {"fc1", "fc2"}};
  const auto s = FindSlowStage({100, 320, 110}, layers);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->stage, 1);
  EXPECT_DOUBLE_EQ(s->others_ms, 105);
  EXPECT_EQ(s->Line(),
            "stage 1 (conv2) is the bottleneck: busy 3.0x the median of the other 2 stages "
            "(320.0 vs 105.0 ms per step); move layers out of it in graph.pipeline");
  const auto two = FindSlowStage({50, 20}, {{"conv1", "relu1", "fc1"}, {"fc2"}});
  ASSERT_TRUE(two);
  EXPECT_EQ(two->stage, 0);
  EXPECT_EQ(two->Line(),
            "stage 0 (conv1 .. fc1) is the bottleneck: busy 2.5x the other stage's "
            "(50.0 vs 20.0 ms per step); move layers out of it in graph.pipeline");
}

TEST(SlowStage, NoneWhenBalancedOrAlone) {
  EXPECT_FALSE(FindSlowStage({100, 140}, {{"a"}, {"b"}}));  // 1.4x: within noise
  EXPECT_FALSE(FindSlowStage({100}, {{"a"}}));
  EXPECT_FALSE(FindSlowStage({0, 0}, {{"a"}, {"b"}}));
  EXPECT_TRUE(FindSlowStage({100, 150}, {{"a"}, {"b"}}));  // 1.5x: named
}

TEST(RankReport, SpreadTableAndScalars) {
  RankReport report;
  report.ranks = {Rank(0, 0.2, 3, 5, 40.5, 0.5), Rank(1, 0.2, 3, 45, 0.5, 0.5),
                  Rank(2, 0.2, 3, 7, 38, 0.5)};
  report.spread = SpreadOf(report.ranks);
  EXPECT_DOUBLE_EQ(report.spread[kBackward].min, 5);
  EXPECT_DOUBLE_EQ(report.spread[kBackward].median, 7);
  EXPECT_DOUBLE_EQ(report.spread[kBackward].max, 45);
  EXPECT_DOUBLE_EQ(SpreadOf({report.ranks[0], report.ranks[1]})[kBackward].median, 25);
  report.straggler = FindStraggler(report.ranks);
  const std::string text = report.Text();
  EXPECT_EQ(text.rfind("step time per rank (ms/step, 3 ranks)", 0), 0u) << text;
  for (const char* phase : {"data", "forward", "backward", "all-reduce", "optimizer"})
    EXPECT_NE(text.find(phase), std::string::npos) << phase;
  EXPECT_NE(text.find("\n  max "), std::string::npos) << text;
  EXPECT_NE(text.find("45.00"), std::string::npos) << text;
  EXPECT_NE(text.find("\nrank 1 is the straggler: its backward"), std::string::npos) << text;
  const auto scalars = RankScalars(report.spread);
  ASSERT_EQ(scalars.size(), 2u * kStepPhases);
  EXPECT_EQ(scalars[4].first, "ranks/backward_ms_median");
  EXPECT_DOUBLE_EQ(scalars[4].second, 7);
  EXPECT_EQ(scalars[7].first, "ranks/allreduce_ms_max");
  EXPECT_DOUBLE_EQ(scalars[7].second, 40.5);
}

}  // namespace
}  // namespace cnnflow
