// graph.cuda_graph's host logic (ops/parallel/step_graph.h): when steps are
// captured and replayed, and which models and settings are not captured.
// The captures themselves run on a GPU (tests/pipeline/cuda_graph_training_test.cc).
#include "ops/parallel/step_graph.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ops/model.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

using Action = CaptureSchedule::Action;

StepKey KeyOfRows(int64_t rows, std::vector<char> needs_grad = {1, 1}) {
  StepKey k;
  k.shape = Shape({rows, 3, 8, 8});
  k.grad_scale = 1.0 / static_cast<double>(rows);
  k.needs_grad = std::move(needs_grad);
  return k;
}

// Drives `schedule` over `keys`, capturing whenever asked; the actions taken.
std::vector<Action> Drive(CaptureSchedule& schedule, const std::vector<StepKey>& keys) {
  std::vector<Action> actions;
  for (const StepKey& k : keys) {
    actions.push_back(schedule.Next(k));
    if (actions.back() == Action::kCapture) schedule.Captured(k);
  }
  return actions;
}

TEST(CaptureSchedule, CapturesAfterTheWarmUpStepsThenReplays) {
  CaptureSchedule s(2);
  const StepKey full = KeyOfRows(32);
  EXPECT_THAT(Drive(s, {full, full, full, full, full}),
              ::testing::ElementsAre(Action::kRun, Action::kRun, Action::kCapture, Action::kReplay,
                                     Action::kReplay));
  EXPECT_TRUE(s.has_capture());
}

// An epoch of 32-row batches ending with 8 rows: the short batch runs
// uncaptured, and the next epoch replays at once.
TEST(CaptureSchedule, AShortBatchRunsUncapturedBetweenReplays) {
  CaptureSchedule s(2);
  const StepKey full = KeyOfRows(32), rest = KeyOfRows(8);
  EXPECT_THAT(Drive(s, {full, full, full, full, rest, full, full, rest, full}),
              ::testing::ElementsAre(Action::kRun, Action::kRun, Action::kCapture, Action::kReplay,
                                     Action::kRun, Action::kReplay, Action::kReplay, Action::kRun,
                                     Action::kReplay));
}

// A parameter group held after its until_epoch changes the backward: the
// new key is captured after its own warm-up, and replaces the old capture.
TEST(CaptureSchedule, ALastingNewKeyIsCapturedAfterItsWarmUp) {
  CaptureSchedule s(2);
  const StepKey before = KeyOfRows(32, {1, 1}), held = KeyOfRows(32, {0, 1});
  EXPECT_FALSE(before == held);
  EXPECT_THAT(
      Drive(s, {before, before, before, held, held, held, held, before}),
      ::testing::ElementsAre(Action::kRun, Action::kRun, Action::kCapture, Action::kRun,
                             Action::kRun, Action::kCapture, Action::kReplay, Action::kRun));
}

// Keys that alternate never run warmup steps in a row: none is captured.
TEST(CaptureSchedule, AlternatingKeysAreNotCaptured) {
  CaptureSchedule s(2);
  const StepKey a = KeyOfRows(32), b = KeyOfRows(16);
  for (Action act : Drive(s, {a, b, a, b, a, b, a, b})) EXPECT_EQ(act, Action::kRun);
  EXPECT_FALSE(s.has_capture());
}

TEST(CaptureSchedule, NothingIsCapturedAfterAFailure) {
  CaptureSchedule s(1);
  const StepKey k = KeyOfRows(32);
  EXPECT_EQ(s.Next(k), Action::kRun);
  EXPECT_EQ(s.Next(k), Action::kCapture);
  s.Failed();
  EXPECT_FALSE(s.has_capture());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(s.Next(k), Action::kRun);
}

TEST(CaptureSchedule, KeysDifferInEachArgumentTheCaptureBakesIn) {
  const StepKey base = KeyOfRows(32);
  StepKey k = base;
  k.label_smoothing = 0.1;
  EXPECT_FALSE(k == base);
  k = base;
  k.grad_scale *= 0.5;  // a window of accumulated batches
  EXPECT_FALSE(k == base);
  k = base;
  k.mixed = true;
  EXPECT_FALSE(k == base);
  k = base;
  k.dtype = DType::kBF16;
  EXPECT_FALSE(k == base);
  EXPECT_TRUE(KeyOfRows(32) == base);
  EXPECT_THROW(CaptureSchedule(0), Error);
}

std::unique_ptr<Model> Build(const std::vector<LayerSpec>& layers) {
  return Model::Build(layers, Shape({3, 8, 8}), {.seed = 1});
}

using testing::Spec;

TEST(StepGraph, SaysWhyAModelOrSettingIsNotCaptured) {
  const std::vector<LayerSpec> plain = {
      Spec("conv", "conv2d", {{"out", int64_t{4}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Spec("flatten", "flatten"), Spec("fc", "linear", {{"out", int64_t{10}}})};
  auto m = Build(plain);
  EXPECT_EQ(StepGraph::WhyNot(*m, 1, 1, DType::kF32), "");
  EXPECT_EQ(StepGraph::WhyNot(*m, 1, 1, DType::kBF16), "");
  EXPECT_THAT(StepGraph::WhyNot(*m, 2, 1, DType::kF32), ::testing::HasSubstr("2 replicas"));
  EXPECT_THAT(StepGraph::WhyNot(*m, 1, 2, DType::kF32), ::testing::HasSubstr("tensor parallelism"));
  EXPECT_THAT(StepGraph::WhyNot(*m, 1, 1, DType::kF16), ::testing::HasSubstr("fp16"));
  for (const char* type : {"dropout", "drop_path"}) {
    std::vector<LayerSpec> layers = plain;
    layers.insert(layers.begin() + 2, Spec("drop", type, {{"p", 0.25}}));
    EXPECT_THAT(StepGraph::WhyNot(*Build(layers), 1, 1, DType::kF32),
                ::testing::HasSubstr(StrCat("layer 'drop' (", type, ") draws new random numbers")));
    layers[2] = Spec("drop", type, {{"p", 0.0}});  // draws nothing
    EXPECT_EQ(StepGraph::WhyNot(*Build(layers), 1, 1, DType::kF32), "") << type;
  }
}

}  // namespace
}  // namespace cnnflow
