// `cnnflow validate`'s figures (pipeline/validate_report.h): the memory a
// run holds before it starts, counted once per data-parallel replica (the
// members of a tensor-parallel group share their rows) and with the
// prefetch stage's memory budget applied to the host's total as well; and
// the graph's plan (stages/graph_plan.h) they and the trainer read.
#include "pipeline/validate_report.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "ops/model.h"
#include "ops/parallel/data_parallel.h"
#include "pipeline/trainer.h"
#include "tests/testing/helpers.h"
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

// The shipped template with `extra` nodes written before metrics and `chain`
// between the optimizer and metrics.
std::string WithNodes(const std::string& extra, const std::string& chain) {
  std::string t = ReadBytes("graphs/data_parallel.yaml");
  const std::string edge = "optimizer -> metrics";
  t.replace(t.rfind(edge), edge.size(), "optimizer -> " + chain + " -> metrics");
  const std::string node = "    metrics:   {stage: metrics}\n";
  t.replace(t.find(node), 0, extra);
  const std::string path = TestDir() + "/with_nodes.yaml";
  WriteBytes(path, t);
  return path;
}

// What trains, the loader's knobs and the optimizer rule come from the
// stages' plan hooks, not from their names.
TEST(GraphPlan, SaysWhatTrainsAndWhereTheLoaderKnobsAre) {
  const Built b = Build({});
  const GraphPlan plan = b.trainer->config().train_graph.Plan();
  EXPECT_EQ(plan.training_nodes, (std::set<std::string>{"devices", "allreduce", "optimizer"}));
  ASSERT_EQ(plan.load_threads_args.size(), 1u);
  EXPECT_EQ(plan.load_threads_args[0].node, "load");
  EXPECT_EQ(plan.load_threads_args[0].arg, "threads");
  ASSERT_EQ(plan.prefetch_depth_args.size(), 1u);
  EXPECT_EQ(plan.prefetch_depth_args[0].node, "prefetch");
  EXPECT_EQ(plan.waits_for_optimizer, std::vector<std::string>{"devices"});
  EXPECT_EQ(plan.optimizer_nodes, std::set<std::string>{"optimizer"});
  EXPECT_FALSE(plan.weight_average.has_value());
  // The eval graph trains nothing and has no optimizer.
  const GraphPlan eval = b.trainer->config().eval_graph.Plan();
  EXPECT_TRUE(eval.training_nodes.empty());
  EXPECT_EQ(eval.load_threads_args.size(), 1u);
}

TEST(GraphPlan, AnEmaNodePlansTheWeightAverage) {
  const Built b =
      Build({"graph.template=" +
             WithNodes("    avg:       {stage: ema, decay: 0.75, eval: false}\n", "avg")});
  const GraphPlan plan = b.trainer->config().train_graph.Plan();
  ASSERT_TRUE(plan.weight_average.has_value());
  EXPECT_EQ(plan.weight_average->node, "avg");
  EXPECT_DOUBLE_EQ(plan.weight_average->decay, 0.75);
  EXPECT_FALSE(plan.weight_average->eval);
  EXPECT_EQ(plan.training_nodes.count("avg"), 1u);
}

TEST(GraphPlan, ASecondEmaNodeIsRefused) {
  const std::string path =
      WithNodes("    ema1:      {stage: ema}\n    ema2:      {stage: ema}\n", "ema1 -> ema2");
  testing::ExpectContains(
      testing::ErrorOf<ConfigError>([&] { Build({"graph.template=" + path}); }),
      {"node 'ema2' (ema): a second ema node (the first is 'ema1')", "with_nodes.yaml:"});
}

// validate lists what each parameter group picks, so a glob's reach is seen
// before a run; a group that picks nothing stops the run before it starts.
TEST(ValidateReport, ParamGroupsSayWhatTheyPick) {
  const Built b =
      Build({"train.param_groups=[{params: [\"*.bias\"], weight_decay: 0}, "
             "{layers: [linear], lr_scale: 2}]"});
  const std::string report = b.trainer->Describe();
  testing::ExpectContains(report, {"parameter groups (sgd):",
                                   "group 0: 4 tensors, lr x1, weight decay 0 (conv1.bias, "
                                   "conv2.bias, fc1.bias, fc2.bias)",
                                   "group 1: 2 tensors, lr x2, weight decay 0 (fc1.weight, "
                                   "fc2.weight)",
                                   "the rest: 2 tensors, lr x1, weight decay 0 (conv1.weight, "
                                   "conv2.weight)"});
  testing::ExpectContains(
      testing::ErrorOf<ConfigError>([] { Build({"train.param_groups=[{params: [fc3.*]}]"}); }),
      {"train.param_groups[0] picks no tensor; the model's are conv1.weight (conv2d)"});
}

}  // namespace
}  // namespace cnnflow
