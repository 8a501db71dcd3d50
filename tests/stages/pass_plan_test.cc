#include "stages/pass_plan.h"

#include <gtest/gtest.h>

#include <vector>

namespace cnnflow {
namespace {

// The windows of a pass of n batches, k per window, cut the plain way: a
// list of windows, each a list of batch indices.
std::vector<std::vector<int64_t>> Windows(int64_t n, int64_t k) {
  std::vector<std::vector<int64_t>> w;
  for (int64_t i = 0; i < n; ++i) {
    if (i % k == 0) w.emplace_back();
    w.back().push_back(i);
  }
  return w;
}

// Every batch of every pass shape against the windows counted by hand,
// from the start of the pass and from a resumed position.
TEST(PassPlan, AgreesWithTheWindowsCountedOneByOne) {
  for (int64_t k = 1; k <= 4; ++k) {
    for (int64_t n = 1; n <= 9; ++n) {
      const auto windows = Windows(n, k);
      for (size_t resumed = 0; resumed < windows.size(); ++resumed) {
        const int64_t first = windows[resumed].front();
        const int64_t steps_before = 100, batches_before = 1000;
        const PassPlan plan(n, k, first, steps_before, batches_before);
        EXPECT_EQ(plan.steps(), static_cast<int64_t>(windows.size()));
        EXPECT_EQ(plan.first(), first);
        int64_t step = steps_before, batch = batches_before;
        for (size_t w = resumed; w < windows.size(); ++w) {
          for (size_t j = 0; j < windows[w].size(); ++j) {
            const int64_t i = windows[w][j];
            SCOPED_TRACE(::testing::Message()
                         << "n " << n << " k " << k << " from " << first << " batch " << i);
            EXPECT_EQ(plan.GlobalStep(i), step);
            EXPECT_EQ(plan.MicroStep(i), batch);
            EXPECT_EQ(plan.EndsWindow(i), j + 1 == windows[w].size());
            EXPECT_EQ(plan.StartsWindow(i), j == 0);
            EXPECT_EQ(plan.WindowBatches(i), static_cast<int64_t>(windows[w].size()));
            ++batch;
          }
          ++step;
        }
      }
    }
  }
}

TEST(PassPlan, AStartInsideAWindowIsAnError) {
  EXPECT_THROW(PassPlan(10, 4, 2), Error);
  EXPECT_NO_THROW(PassPlan(10, 4, 8));
  EXPECT_EQ(PassPlan(10, 4, 12).first(), 10) << "a start past the end is the end";
}

TEST(PassBatches, CutsAtMaxStepsAndDropsTheLastWhenAsked) {
  EXPECT_EQ(PassBatches(100, 32, false, 0), 4);
  EXPECT_EQ(PassBatches(100, 32, true, 0), 3);
  EXPECT_EQ(PassBatches(100, 32, false, 2), 2);
  EXPECT_EQ(PassBatches(100, 32, false, 50), 4);
}

}  // namespace
}  // namespace cnnflow
