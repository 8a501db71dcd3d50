// `cnnflow validate`'s figures (pipeline/validate_report.h): the memory a
// run holds before it starts, counted once per data-parallel replica (the
// members of a tensor-parallel group share their rows) and with the
// prefetch stage's memory budget applied to the host's total as well.
#include "pipeline/validate_report.h"

#include <gtest/gtest.h>

#include "ops/model.h"
#include "ops/parallel/data_parallel.h"
#include "pipeline/trainer.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

using testing::ReadBytes;
using testing::TestDir;
using testing::WriteBytes;

struct Built {
  std::unique_ptr<Trainer> trainer;
  MemoryEstimate memory;
};

Built Build(std::vector<std::string> sets) {
  sets.push_back("threads=2");
  Built b;
  b.trainer = std::make_unique<Trainer>(LoadRunConfig("configs/fashion_mnist.yaml", sets));
  b.memory = EstimateMemory(b.trainer->config(), b.trainer->model(),
                            b.trainer->replicas().data_parallel(), false);
  return b;
}

TEST(ValidateReport, TensorParallelMembersShareTheirBatch) {
  const Built one = Build({});
  const Built tp = Build(
      {"graph.devices=[cpu:0, cpu:1]", "graph.tensor_parallel={size: 2, layers: {conv2: column}}"});
  const Built dp = Build({"graph.devices=[cpu:0, cpu:1]"});
  EXPECT_GT(one.memory.batch_mb, 0);
  EXPECT_DOUBLE_EQ(tp.memory.batch_mb, one.memory.batch_mb);      // 2 members, one group's rows
  EXPECT_DOUBLE_EQ(dp.memory.batch_mb, 2 * one.memory.batch_mb);  // 2 replicas, 2 x the rows
  const std::string report = tp.trainer->Describe();
  char want[64];
  std::snprintf(want, sizeof want, "(4 x %.2f MB)", one.memory.batch_mb);
  EXPECT_NE(report.find(want), std::string::npos) << report;
}

TEST(ValidateReport, TheHostTotalKeepsToThePrefetchBudget) {
  const Built free = Build({});
  const double budget = 2.5 * free.memory.batch_mb;  // room for 2 batches
  const Built capped = Build({"graph.prefetch_mb=" + std::to_string(budget)});
  EXPECT_EQ(free.memory.prefetch_depth, 4);
  EXPECT_EQ(capped.memory.prefetch_depth, 2);
  EXPECT_DOUBLE_EQ(capped.memory.prefetch_mb, 2 * capped.memory.batch_mb);
  EXPECT_DOUBLE_EQ(capped.memory.host_mb, capped.memory.prefetch_mb + capped.memory.activations_mb +
                                              capped.memory.state_mb);
  EXPECT_LT(capped.memory.host_mb, free.memory.host_mb);
}

// A user template whose sampler cuts other batches than train.batch: the
// step count (and so the LR schedule's length) is the sampler's, read from
// the graph's plan, not re-derived from train.batch.
TEST(GraphPlan, TheStepCountIsTheSamplersBatches) {
  std::string tmpl = ReadBytes("graphs/data_parallel.yaml");
  const std::string from = "batch: $train.batch, replicas: $graph.replicas";
  const size_t at = tmpl.find(from);
  ASSERT_NE(at, std::string::npos);
  tmpl.replace(at, from.size(), "batch: 32, replicas: $graph.replicas");
  const std::string path = TestDir() + "/half_batches.yaml";
  WriteBytes(path, tmpl);
  const Built shipped = Build({"train.batch=64"});
  const Built user = Build({"train.batch=64", "graph.template=" + path});
  EXPECT_EQ(shipped.trainer->steps_per_epoch(), 938);  // 60,000 / 64, rounded up
  EXPECT_EQ(user.trainer->steps_per_epoch(), 1875);    // 60,000 / 32
  EXPECT_EQ(shipped.trainer->config().train_graph.Plan().batch_samples, 64);
  EXPECT_NE(user.trainer->Describe().find("steps per epoch: 1875"), std::string::npos);
}

}  // namespace
}  // namespace cnnflow
