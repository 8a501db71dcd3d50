// WeightAverage: the update rule against an independent f64 reference, the
// swap used for evaluation, and loading that names what is missing.
#include "ops/train/weight_average.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

std::unique_ptr<Model> SmallModel(uint64_t seed) {
  return Model::Build(
      {testing::Spec("conv", "conv2d", {{"out", int64_t{3}}, {"kernel", int64_t{3}}}),
       testing::Spec("bn", "batchnorm"), testing::Spec("flat", "flatten"),
       testing::Spec("fc", "linear", {{"out", int64_t{4}}})},
      {2, 5, 5}, {.seed = seed});
}

std::vector<std::vector<double>> Values(Model& m) {
  std::vector<std::vector<double>> v;
  for (auto& [name, t] : m.StateTensors()) {
    v.emplace_back();
    for (int64_t i = 0; i < t.numel(); ++i) v.back().push_back(t.At(i));
  }
  return v;
}

TEST(WeightAverage, FollowsTheUpdateRuleForParametersAndBuffers) {
  auto model = SmallModel(1);
  const double d = 0.75;
  WeightAverage ema(*model, d);
  ASSERT_EQ(ema.tensors().size(), model->StateTensors().size());
  EXPECT_EQ(ema.tensors()[0].first, "ema.conv.weight");
  std::vector<std::vector<double>> want = Values(*model);  // starts as the weights
  for (int step = 0; step < 3; ++step) {
    // "An optimizer step": new weights and BN statistics.
    auto fresh = SmallModel(10 + step);
    auto src = fresh->StateTensors();
    auto dst = model->StateTensors();
    for (size_t i = 0; i < dst.size(); ++i) dst[i].second.CopyFrom(src[i].second);
    const auto now = Values(*model);
    for (size_t i = 0; i < want.size(); ++i)
      for (size_t j = 0; j < want[i].size(); ++j) want[i][j] = d * want[i][j] + (1 - d) * now[i][j];
    ema.Update(*model);
  }
  EXPECT_EQ(ema.updates(), 3);
  for (size_t i = 0; i < want.size(); ++i) {
    const Tensor& got = ema.tensors()[i].second;
    for (size_t j = 0; j < want[i].size(); ++j) {
      EXPECT_NEAR(got.At(static_cast<int64_t>(j)), want[i][j], 1e-6 * (1 + std::fabs(want[i][j])))
          << ema.tensors()[i].first << "[" << j << "]";
    }
  }
}

TEST(WeightAverage, WarmupStartsWithSmallDecays) {
  auto model = SmallModel(1);
  WeightAverage ema(*model, 0.999, /*warmup=*/true);
  const auto before = Values(*model);
  auto fresh = SmallModel(7);
  auto src = fresh->StateTensors();
  auto dst = model->StateTensors();
  for (size_t i = 0; i < dst.size(); ++i) dst[i].second.CopyFrom(src[i].second);
  const auto now = Values(*model);
  ema.Update(*model);  // t = 0: d = 1 / 10
  const Tensor& got = ema.tensors()[0].second;
  for (int64_t j = 0; j < got.numel(); ++j) {
    EXPECT_NEAR(got.At(j), 0.1 * before[0][j] + 0.9 * now[0][j], 1e-6) << j;
  }
}

TEST(WeightAverage, SwapExchangesAndRestores) {
  auto model = SmallModel(1);
  WeightAverage ema(*model, 0.5);
  auto other = SmallModel(2);
  auto src = other->StateTensors();
  auto dst = model->StateTensors();
  for (size_t i = 0; i < dst.size(); ++i) dst[i].second.CopyFrom(src[i].second);
  const auto trained = Values(*model);
  ema.Update(*model);
  std::vector<std::vector<double>> avg;
  for (const auto& [n, t] : ema.tensors()) {
    avg.emplace_back();
    for (int64_t i = 0; i < t.numel(); ++i) avg.back().push_back(t.At(i));
  }
  ema.Swap(*model);
  EXPECT_EQ(Values(*model), avg) << "the model holds the average";
  ema.Swap(*model);
  EXPECT_EQ(Values(*model), trained) << "and its own weights again";
}

TEST(WeightAverage, LoadNamesWhatIsMissingAndBadDecaysAreErrors) {
  auto model = SmallModel(1);
  WeightAverage ema(*model, 0.9);
  std::vector<std::pair<std::string, Tensor>> named = ema.tensors();
  named.pop_back();
  try {
    ema.Load(named, 5, "ck.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ck.safetensors: has no tensor 'ema.fc.bias'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(WeightAverage(*model, 1.0), ConfigError);
  EXPECT_THROW(WeightAverage(*model, -0.1), ConfigError);
}

// The lookahead schedule: every 5th step from step 10, the decay ramped as
// (steps / 20)^3; each update as the f64 rule with that decay, and CopyTo
// makes the weights the average.
TEST(WeightAverage, AScheduleUpdatesEveryKthStepWithARampedDecay) {
  auto model = SmallModel(1);
  const double decay = 0.8;
  WeightAverage ema(*model, decay, /*warmup=*/false,
                    {.every = 5, .start_step = 10, .ramp_power = 3, .total_steps = 20});
  std::vector<std::vector<double>> want = Values(*model);
  std::vector<int64_t> updated;
  for (int64_t steps = 1; steps <= 20; ++steps) {
    auto fresh = SmallModel(100 + steps);
    auto src = fresh->StateTensors();
    auto dst = model->StateTensors();
    for (size_t i = 0; i < dst.size(); ++i) dst[i].second.CopyFrom(src[i].second);
    if (!ema.UpdateAfter(*model, steps)) continue;
    updated.push_back(steps);
    const double d = decay * std::pow(steps / 20.0, 3);
    const auto now = Values(*model);
    for (size_t i = 0; i < want.size(); ++i)
      for (size_t j = 0; j < want[i].size(); ++j) want[i][j] = d * want[i][j] + (1 - d) * now[i][j];
  }
  EXPECT_EQ(updated, (std::vector<int64_t>{10, 15, 20}));
  EXPECT_EQ(ema.updates(), 3);
  for (size_t i = 0; i < want.size(); ++i)
    for (size_t j = 0; j < want[i].size(); ++j)
      EXPECT_NEAR(ema.tensors()[i].second.At(static_cast<int64_t>(j)), want[i][j],
                  1e-6 * (1 + std::fabs(want[i][j])));
  ema.CopyTo(*model);
  const auto copied = Values(*model);
  for (size_t i = 0; i < want.size(); ++i)
    for (size_t j = 0; j < want[i].size(); ++j)
      EXPECT_EQ(copied[i][j], ema.tensors()[i].second.At(static_cast<int64_t>(j)));
  // Another replica's copy: the same tensors and count, its own storage.
  auto other = SmallModel(7);
  auto copy = ema.CopyFor(*other);
  EXPECT_EQ(copy->updates(), 3);
  EXPECT_EQ(Values(*other), Values(*SmallModel(7)));  // its weights untouched
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(copy->tensors()[i].second.At(0), ema.tensors()[i].second.At(0));
  EXPECT_THROW(WeightAverage(*model, 0.5, false, {.every = 0}), ConfigError);
}

}  // namespace
}  // namespace cnnflow
