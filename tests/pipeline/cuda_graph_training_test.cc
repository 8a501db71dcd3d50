// graph.cuda_graph (ops/parallel/step_graph.h) through the whole trainer on
// one GPU: a run whose steps replay CUDA graphs ends with the same bits as
// the same run uncaptured (deterministic algorithms, TF32 off), with an
// epoch's short last batch running uncaptured between replays, evaluation
// between epochs, a schedule that changes the learning rate every step (the
// optimizer's update replayed with each step's rate), and
// a parameter group held after its first epoch (which changes the backward,
// so the step is captured again). GPU tests skip without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ops/device.h"
#include "pipeline/trainer.h"
#include "tests/testing/helpers.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

// A ResNet block (its BN finished by the add under channels_last) on
// synthetic data: 200 samples in batches of 32, so each epoch ends with a
// batch of 8.
std::string WriteConfig(const fs::path& dir) {
  const std::string path = (dir / "graphs.yaml").string();
  std::ofstream(path) << R"(name: cuda-graphs
seed: 3
threads: 2
data:
  train: {source: synthetic, shape: [3, 16, 16], classes: 10, size: 200, seed: 1}
  test: {source: synthetic, shape: [3, 16, 16], classes: 10, size: 64, seed: 2}
model:
  input: [3, 16, 16]
  label_smoothing: 0.1
  layers:
    - {name: conv1, conv2d: {out: 16, kernel: 3, pad: 1, bias: false}}
    - {name: bn1, batchnorm: {}}
    - {name: relu1, relu: {}}
    - {name: conv2, conv2d: {out: 16, kernel: 3, pad: 1, bias: false}}
    - {name: bn2, batchnorm: {}}
    - {name: add, add: {}, inputs: [bn2, relu1]}
    - {name: relu2, relu: {}}
    - {name: pool, global_avgpool: {}}
    - {name: flatten, flatten: {}}
    - {name: fc, linear: {out: 10}}
train:
  epochs: 2
  batch: 32
  optimizer: {sgd: {lr: 0.1, momentum: 0.9, nesterov: true, weight_decay: 0.0005}}
  schedule: {decay: cosine}
graph: {devices: [cuda:0], tf32: false, deterministic: true, load_threads: 1}
)";
  return path;
}

struct TrainedRun {
  std::string weights;  // model.safetensors
  ReplicaSet::CudaGraphStatus graphs;
};

TrainedRun Train(const std::string& config, const fs::path& dir, std::vector<std::string> sets) {
  Trainer t(LoadRunConfig(config, sets));
  t.Train(dir.string());
  return {testing::ReadBytes((dir / "model.safetensors").string()), t.replicas().cuda_graph(0)};
}

struct Variant {
  const char* name;
  std::vector<std::string> sets;
  int64_t replayed;  // of the 14 steps
  int captures;
};

TEST(CudaGraphTrainingGPU, ReplayedStepsEndWithTheBitsOfUncapturedOnes) {
  if (!CudaAvailable()) GTEST_SKIP() << "no GPU found: GPU test skipped";
  const fs::path dir = testing::TestDir();
  const std::string config = WriteConfig(dir);
  // Each epoch: 6 batches of 32, then one of 8. The first epoch replays
  // from its third step (two warm-up steps, then the capture) to its
  // sixth; the second replays its 6 full batches, or, with conv1 held
  // after epoch 1 (a new backward), captures again after two steps.
  const std::vector<Variant> variants = {
      {"fp32", {}, 10, 1},
      {"bf16 channels_last", {"graph.precision=bf16", "graph.channels_last=true"}, 10, 1},
      {"group held after epoch 1",
       {"train.param_groups=[{params: [conv1.weight], until_epoch: 1}]"},
       8,
       2},
  };
  for (const Variant& v : variants) {
    std::vector<std::string> on = v.sets, off = v.sets;
    on.push_back("graph.cuda_graph=true");
    const TrainedRun eager = Train(config, dir / v.name / "eager", off);
    const TrainedRun graphs = Train(config, dir / v.name / "graphs", on);
    EXPECT_FALSE(eager.graphs.requested) << v.name;
    EXPECT_EQ(graphs.graphs.why_not, "") << v.name;
    EXPECT_EQ(graphs.graphs.replayed_steps, v.replayed) << v.name;
    EXPECT_EQ(graphs.graphs.captures, v.captures) << v.name;
    // The optimizer's update from the first capture on (steps 3 to 14):
    // after a short batch too, and captured again with the step.
    EXPECT_EQ(graphs.graphs.replayed_updates, 12) << v.name;
    EXPECT_TRUE(graphs.weights == eager.weights)
        << v.name << ": the run with CUDA graphs ended with other weights";
  }
  fs::remove_all(dir);
}

// A model with dropout is not captured (a replay would repeat the capture's
// masks): the run trains uncaptured and says why.
TEST(CudaGraphTrainingGPU, DropoutRunsUncapturedAndSaysWhy) {
  if (!CudaAvailable()) GTEST_SKIP() << "no GPU found: GPU test skipped";
  Trainer t(LoadRunConfig(
      "bench/configs/mlp2_synthetic.yaml",
      {"train.max_steps=6", "threads=2", "graph.load_threads=1", "graph.cuda_graph=true",
       "model.layers=[{name: flatten, flatten: {}}, {name: drop, dropout: {p: "
       "0.5}}, {name: fc, linear: {out: 10}}]"}));
  t.RunPass(t.config().train_graph, {.pass = "train", .epoch = 0});
  const ReplicaSet::CudaGraphStatus s = t.replicas().cuda_graph(0);
  EXPECT_TRUE(s.requested);
  EXPECT_EQ(s.replayed_steps, 0);
  EXPECT_THAT(s.why_not, ::testing::HasSubstr("layer 'drop' (dropout) draws new random numbers"));
}

}  // namespace
}  // namespace cnnflow
