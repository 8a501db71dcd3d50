// The prefetch stage: the bound on batches in flight, by depth and by
// memory budget.
#include <gtest/gtest.h>

#include <string>

#include "pipeline/executor.h"
#include "stages/stage.h"
#include "tests/testing/helpers.h"
#include "tests/testing/stage_test_util.h"

namespace cnnflow {
namespace {

using testing::g_seen;
using testing::Graph;
using PrefetchTest = testing::StageGraphTest;

TEST_F(PrefetchTest, PrefetchBoundsBatchesInFlight) {
  // A slow consumer behind four loader threads: without the limiter every
  // batch would be loaded at once.
  RunGraph(Graph(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 4}
    prefetch: {stage: prefetch, depth: 3}
    load: {stage: load_batch, threads: 4}
    record: {stage: test_record, sleep_us: 3000}
  edges: [sample -> prefetch -> load -> record]
)"),
           run, *pass);
  EXPECT_EQ(g_seen.size(), 50u);
  EXPECT_LE(control.max_in_flight.load(), 3);
  EXPECT_EQ(control.max_in_flight.load(), 3) << "the consumer is slow: the bound should be reached";
  EXPECT_EQ(control.in_flight.load(), 0);
}

TEST_F(PrefetchTest, PrefetchMemoryBudgetCapsBatchesInFlight) {
  pass->batch_bytes = 4 * 4 * 4;  // batch 4 x [1, 2, 2] floats = 64 bytes
  RunGraph(Graph(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 4}
    prefetch: {stage: prefetch, depth: 8, memory_mb: 0.0002}
    load: {stage: load_batch, threads: 4}
    record: {stage: test_record, sleep_us: 3000}
  edges: [sample -> prefetch -> load -> record]
)"),
           run, *pass);
  EXPECT_EQ(g_seen.size(), 50u);
  // 200 bytes hold 3 batches of 64, though depth allows 8.
  EXPECT_EQ(control.max_in_flight.load(), 3);
}

TEST_F(PrefetchTest, PrefetchBudgetSmallerThanABatchIsAnError) {
  pass->batch_bytes = 3'000'000;
  const GraphSpec spec = Graph(
      "train:\n  nodes:\n    sample: {stage: sampler, batch: 4}\n"
      "    prefetch: {stage: prefetch, memory_mb: 2}\n    record: {stage: test_record}\n"
      "  edges: [sample -> prefetch -> record]\n");
  testing::ExpectContains(testing::ErrorOf<StageError>([&] { RunGraph(spec, run, *pass); }),
                          {"node 'prefetch' (prefetch): memory_mb 2 holds no batch: one batch is "
                           "3 MB"});
}

}  // namespace
}  // namespace cnnflow
