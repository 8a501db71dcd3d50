// Fine-tuning as a guide writes it: downloaded weights (a .pth that torch.save
// wrote as a DDP checkpoint, tests/data/make_finetune_fixture.py) in a small
// library ResNet with a new 4-class head, the stem and layer1 frozen with
// train.freeze, on two replicas. Frozen tensors end byte for byte as loaded,
// the others move; with train.frozen_bn: eval the frozen BN statistics stay
// put too; the frozen part's backward never runs (counted in the profiler's
// spans); and the config's mistakes are named errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ops/io/weights_file.h"
#include "ops/trace.h"
#include "pipeline/trainer.h"
#include "tests/testing/helpers.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

const char* kPretrained = "tests/data/pth/resnet_tiny_pretrained.pth";

std::vector<std::string> Overrides(const std::string& frozen_bn) {
  return {
      "model={library: resnet50, input: [3, 32, 32], with: {classes: 4, width: 8, "
      "depths: [1, 2, 1, 1], groups: 2, width_per_group: 16}}",
      "data.train={source: synthetic, shape: [3, 32, 32], classes: 4, size: 64}",
      "data.test={source: synthetic, shape: [3, 32, 32], classes: 4, size: 16, seed: 1}",
      "data.transform=[]",
      "train.epochs=1",
      "train.max_steps=4",
      "train.batch=8",
      "train.optimizer={sgd: {lr: 0.05, momentum: 0.9, weight_decay: 0.001}}",
      "train.schedule={}",
      StrCat("train.init={weights: ", kPretrained, ", skip: [fc.*]}"),
      "train.freeze=[conv1.*, bn1.*, layer1.*]",
      StrCat("train.frozen_bn=", frozen_bn),
      "graph.devices=[cpu:0, cpu:1]",
      "threads=2"};
}

std::map<std::string, Tensor> State(Trainer& t) {
  std::map<std::string, Tensor> out;
  for (auto& [name, tensor] : t.model().StateTensors()) out[name] = tensor.To(Device::Cpu());
  return out;
}

bool Frozen(const std::string& name) {
  return name.rfind("conv1.", 0) == 0 || name.rfind("bn1.", 0) == 0 ||
         name.rfind("layer1.", 0) == 0;
}

// Trains the config; returns the tensors before and after and the layers
// whose backward ran (from the profiler's "backward" spans).
struct FineTune {
  std::map<std::string, Tensor> before, after;
  std::map<std::string, int> backward_runs;  // "layer2.0.conv1 (conv2d)" -> count
};

FineTune Train(const std::string& frozen_bn) {
  Trainer trainer(LoadRunConfig("configs/fashion_mnist.yaml", Overrides(frozen_bn)));
  FineTune r;
  r.before = State(trainer);
  Tracer::Start();
  trainer.Train(testing::TestDir());
  Tracer::Stop();
  for (const TraceEvent& e : Tracer::Spans())
    if (e.category == "backward") ++r.backward_runs[e.name];
  r.after = State(trainer);
  return r;
}

TEST(Freeze, FineTunesADownloadedPthWithTheStemAndLayer1Frozen) {
  const FineTune r = Train("eval");
  // The loaded weights are the file's (f16 there, exactly f32 here).
  const SafetensorsFile file = LoadWeightsFile(kPretrained);
  const Tensor* w = file.Find("module.layer1.0.conv2.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(testing::SameBytes(r.before.at("layer1.0.conv2.weight"), w->Cast(DType::kF32)));

  int frozen = 0, moved = 0;
  for (const auto& [name, t] : r.after) {
    if (name.find("num_batches_tracked") != std::string::npos) continue;
    if (Frozen(name)) {  // weights and, in eval mode, BN statistics: as loaded
      EXPECT_TRUE(testing::SameBytes(t, r.before.at(name))) << name << " changed though frozen";
      ++frozen;
    } else if (name.find("running_") == std::string::npos) {
      moved += !testing::SameBytes(t, r.before.at(name));
    }
  }
  EXPECT_GE(frozen, 20);
  EXPECT_GE(moved, 30) << "the unfrozen layers train";
  // The frozen part's backward never ran; the rest's did, every step on
  // each replica.
  for (const auto& [span, n] : r.backward_runs)
    EXPECT_FALSE(Frozen(span)) << span << " ran backward " << n << " times";
  EXPECT_EQ(r.backward_runs.count("conv1 (conv2d)"), 0u);
  EXPECT_EQ(r.backward_runs.at("layer2.0.conv1 (conv2d)"), 2 * 4);
  EXPECT_EQ(r.backward_runs.at("fc (linear)"), 2 * 4);
}

TEST(Freeze, FrozenBatchNormTrainsItsStatisticsUnlessHeldInEvalMode) {
  const FineTune r = Train("train");
  // requires_grad alone: the weights hold, the batch statistics still move.
  EXPECT_TRUE(testing::SameBytes(r.after.at("bn1.weight"), r.before.at("bn1.weight")));
  EXPECT_FALSE(testing::SameBytes(r.after.at("bn1.running_mean"), r.before.at("bn1.running_mean")));
  EXPECT_FALSE(testing::SameBytes(r.after.at("layer1.0.bn2.running_var"),
                                  r.before.at("layer1.0.bn2.running_var")));
}

TEST(Freeze, MistakesAreNamedErrors) {
  auto with = [](std::vector<std::string> extra) {
    std::vector<std::string> o = Overrides("train");
    o.insert(o.end(), extra.begin(), extra.end());
    return testing::ErrorOf([&] { Trainer t(LoadRunConfig("configs/fashion_mnist.yaml", o)); });
  };
  testing::ExpectContains(with({"train.freeze=[layr1.*]"}),
                          {"train.freeze: 'layr1.*' names no tensor of the model"});
  testing::ExpectContains(with({"train.freeze=['*']"}),
                          {"every tensor of the model is frozen", "nothing would train"});
  testing::ExpectContains(
      with({"train.param_groups=[{params: [layer1.*], until_epoch: 0}]"}),
      {"until_epoch: 0 would train these tensors for no epochs", "train.freeze"});
  // A group of frozen tensors is allowed: it says so instead.
  Trainer t(LoadRunConfig("configs/fashion_mnist.yaml", [] {
    std::vector<std::string> o = Overrides("train");
    o.push_back("train.param_groups=[{params: [layer1.*], lr_scale: 0.1}]");
    return o;
  }()));
  // `cnnflow validate` lists what is frozen, and says so of the group.
  testing::ExpectContains(t.Describe(),
                          {"frozen (train.freeze, trainable: false): ", "conv1.weight",
                           "picks only frozen tensors", "the group changes nothing"});
}

}  // namespace
}  // namespace cnnflow
