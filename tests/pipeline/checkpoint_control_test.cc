// Checkpoint control (pipeline/checkpoint_control.h): a save and a resume
// restore weights, optimizer state and the run's position; a checkpoint of
// another config is refused; a failed write says what the run can go on
// from; train.init loads what fits, strictly or not.
#include "pipeline/checkpoint_control.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ops/io/safetensors.h"
#include "tests/testing/helpers.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

using testing::ErrorOf;
using testing::ExpectContains;
using testing::Spec;
using testing::TestDir;

std::unique_ptr<Model> SmallModel(uint64_t seed, int64_t hidden = 4) {
  return Model::Build({Spec("fc1", "linear", {{"out", hidden}}), Spec("relu", "relu"),
                       Spec("fc2", "linear", {{"out", int64_t{3}}})},
                      {5}, DType::kF32, seed);
}

std::unique_ptr<Optimizer> Sgd(Model& m) {
  Args a;
  a.Set("lr", 0.1);
  a.Set("momentum", 0.9);
  a.FillDefaults(OptimizerSchema("sgd"));
  return MakeOptimizer("sgd", a, m.NamedParameters());
}

bool SameState(Model& a, Model& b) {
  auto x = a.StateTensors(), y = b.StateTensors();
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i].first != y[i].first || x[i].second.nbytes() != y[i].second.nbytes() ||
        std::memcmp(x[i].second.raw_data(), y[i].second.raw_data(), x[i].second.nbytes()) != 0) {
      return false;
    }
  }
  return true;
}

// One SGD step with a made-up gradient, so the momentum buffers hold state.
void Step(Model& m, Optimizer& opt) {
  for (auto& p : m.NamedParameters()) {
    p.param->grad = Tensor::Full(p.param->value.shape(), 0.5, p.param->value.dtype());
  }
  opt.Step(0.1);
}

void Say(const std::string&) {}

TEST(CheckpointControl, SaveThenResumeRestoresTensorsAndPosition) {
  const std::string dir = TestDir();
  auto model = SmallModel(1);
  auto opt = Sgd(*model);
  Step(*model, *opt);
  TrainedTensors tensors{{model.get()}, {opt.get()}, true, nullptr};
  TrainPosition at;
  at.epoch = 2;
  at.batch_in_epoch = 7;
  at.global_step = 31;
  at.batches_done = 31;
  at.partial_train.loss_sum = 1.25;
  at.partial_train.correct = 5;
  at.partial_train.samples = 8;
  at.partial_train.batches = 7;
  at.metrics_rows = {{1, 0.5, 0.75, 0.4, 0.8, 100, 2, 0.1, 0}};
  at.log_window = "0.5 1 2";
  CheckpointControl(/*config_hash=*/"abc", /*seed=*/9, /*keep=*/2).Save(dir, at, tensors);

  auto saved = SmallModel(1);  // the weights as saved
  {
    auto o = Sgd(*saved);
    Step(*saved, *o);
  }
  // Train on, then resume into fresh instances.
  Step(*model, *opt);
  auto fresh = SmallModel(5);
  auto fresh_opt = Sgd(*fresh);
  EXPECT_FALSE(SameState(*fresh, *saved));
  CheckpointControl control("abc", 9, 2);
  std::vector<std::string> said;
  const TrainPosition got = control.Resume(dir, {{fresh.get()}, {fresh_opt.get()}, true, nullptr},
                                           [&](const std::string& s) { said.push_back(s); });
  EXPECT_TRUE(SameState(*fresh, *saved));
  EXPECT_EQ(got.epoch, 2);
  EXPECT_EQ(got.batch_in_epoch, 7);
  EXPECT_EQ(got.global_step, 31);
  EXPECT_EQ(got.batches_done, 31);
  EXPECT_EQ(got.partial_train.loss_sum, 1.25);
  EXPECT_EQ(got.partial_train.correct, 5);
  EXPECT_EQ(got.partial_train.samples, 8);
  EXPECT_EQ(got.partial_train.batches, 7);
  EXPECT_EQ(got.metrics_rows, at.metrics_rows);
  EXPECT_EQ(got.log_window, "0.5 1 2");
  EXPECT_EQ(fresh_opt->step_count(), 1);
  ASSERT_FALSE(said.empty());
  EXPECT_NE(said.back().find("epoch 3, batch 7, step 31"), std::string::npos) << said.back();
}

TEST(CheckpointControl, ResumeRestoresMomentum) {
  const std::string dir = TestDir();
  auto a = SmallModel(1);
  auto a_opt = Sgd(*a);
  Step(*a, *a_opt);
  CheckpointControl("h", 1, 0).Save(dir, TrainPosition{}, {{a.get()}, {a_opt.get()}, true});
  auto b = SmallModel(2);
  auto b_opt = Sgd(*b);
  CheckpointControl("h", 1, 0).Resume(dir, {{b.get()}, {b_opt.get()}, true}, Say);
  // With the momentum restored, one more step of each stays identical; a
  // lost buffer would make b's step smaller.
  Step(*a, *a_opt);
  Step(*b, *b_opt);
  EXPECT_TRUE(SameState(*a, *b));
}

TEST(CheckpointControl, OtherConfigIsRefused) {
  const std::string dir = TestDir();
  auto m = SmallModel(1);
  auto opt = Sgd(*m);
  const std::string there = "train: {batch: 8, epochs: 2}\ngraph: {logical_replicas: 4}\n";
  const std::string here = "train: {batch: 8, epochs: 2}\ngraph: {logical_replicas: 3}\n";
  CheckpointControl(there, 1, 0).Save(dir, TrainPosition{}, {{m.get()}, {opt.get()}, true});
  // The keys that differ are named; the same identity loads.
  ExpectContains(ErrorOf<ConfigError>([&] {
                   CheckpointControl(here, 1, 0).Resume(dir, {{m.get()}, {opt.get()}, true}, Say);
                 }),
                 {"different run: graph.logical_replicas is 4 there, 3 here", "config.yaml"});
  EXPECT_NO_THROW(CheckpointControl(there, 1, 0).Resume(dir, {{m.get()}, {opt.get()}, true}, Say));
}

TEST(CheckpointControl, NoCheckpointToResume) {
  const std::string dir = TestDir();
  auto m = SmallModel(1);
  auto opt = Sgd(*m);
  ExpectContains(ErrorOf([&] {
                   CheckpointControl("h", 1, 0).Resume(dir, {{m.get()}, {opt.get()}, true}, Say);
                 }),
                 {"no valid checkpoint to resume from"});
}

std::string GuardMessage(const CheckpointControl& c) {
  return ErrorOf([&] { c.Guard([] { throw Error("out.csv: No space left on device"); }); });
}

TEST(CheckpointControl, FailedWriteSaysWhatTheRunCanGoOnFrom) {
  const std::string dir = TestDir();
  CheckpointControl control("h", 1, 0);
  EXPECT_EQ(GuardMessage(control),
            "out.csv: No space left on device; no checkpoint had been written yet: the run must "
            "start again");
  auto m = SmallModel(1);
  auto opt = Sgd(*m);
  TrainPosition at;
  at.global_step = 12;
  control.Save(dir, at, {{m.get()}, {opt.get()}, true});
  EXPECT_EQ(GuardMessage(control),
            "out.csv: No space left on device; the checkpoints written before it are intact: "
            "--resume " +
                dir + " continues from the newest (step 12)");
}

TEST(InitFromWeights, LoadsIntoEveryModel) {
  const std::string file = TestDir() + "/w.safetensors";
  auto source = SmallModel(3);
  SaveSafetensors(file, source->StateTensors());
  auto a = SmallModel(4), b = SmallModel(5);
  const std::string report = InitFromWeights(file, true, {}, {a.get(), b.get()});
  EXPECT_TRUE(SameState(*a, *source));
  EXPECT_TRUE(SameState(*b, *source));
  EXPECT_NE(report.find("train.init: 4 tensors from"), std::string::npos) << report;
}

TEST(InitFromWeights, StrictRefusesAMismatchNonStrictLoadsWhatFits) {
  const std::string file = TestDir() + "/w.safetensors";
  auto source = SmallModel(3, /*hidden=*/6);  // fc1 and fc2.weight differ in shape
  SaveSafetensors(file, source->StateTensors());
  auto m = SmallModel(4);
  ExpectContains(ErrorOf<ConfigError>([&] { InitFromWeights(file, true, {}, {m.get()}); }),
                 {"does not fit the model", "fc1.weight"});
  const auto fc2_bias_before = m->StateTensors()[3].second.Clone();
  const std::string report = InitFromWeights(file, false, {}, {m.get()});
  EXPECT_NE(report.find("left at their fresh initialisation"), std::string::npos) << report;
  // fc2.bias fits (3 outputs either way) and was loaded.
  const auto got = m->StateTensors(), want = source->StateTensors();
  ASSERT_EQ(got[3].first, "fc2.bias");
  EXPECT_EQ(
      std::memcmp(got[3].second.raw_data(), want[3].second.raw_data(), want[3].second.nbytes()), 0);
  EXPECT_NE(
      std::memcmp(got[3].second.raw_data(), fc2_bias_before.raw_data(), want[3].second.nbytes()),
      0);
}

}  // namespace
}  // namespace cnnflow
