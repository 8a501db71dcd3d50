// The model DAG: layers by name, residual fan-out (gradients sum), whole-
// model gradients against finite differences, init and state naming.
#include "ops/model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "ops/cpu/elementwise.h"
#include "ops/device.h"
#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

LayerSpec L(std::string name, std::string type, std::vector<std::pair<std::string, ParamValue>> args = {},
            std::vector<std::string> inputs = {}) {
  LayerSpec s{std::move(name), std::move(type), {}, std::move(inputs)};
  for (auto& [k, v] : args) s.args.Set(k, v);
  return s;
}

// conv -> relu -> conv, with a residual add of the relu output: relu1 feeds
// two layers, so its gradient is a sum.
std::vector<LayerSpec> ResidualSpecs() {
  return {L("conv1", "conv2d", {{"out", int64_t{3}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
          L("relu1", "relu"),
          L("conv2", "conv2d", {{"out", int64_t{3}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
          L("res", "add", {}, {"conv2", "relu1"}),
          L("flat", "flatten"),
          L("fc", "linear", {{"out", int64_t{4}}})};
}

TEST(Model, ResidualModelGradientsMatchFiniteDifferences) {
  auto model = Model::Build(ResidualSpecs(), {2, 5, 4}, DType::kF64, 3);
  EXPECT_EQ(model->output_shape(), Shape({4}));
  const Tensor x = testing::RandomTensor({2, 2, 5, 4}, 5);
  const Tensor r = testing::RandomTensor({2, 4}, 6);
  ForwardContext ctx;
  auto loss = [&] {
    const Tensor& y = model->Forward(x, ctx);
    double s = 0;
    for (int64_t i = 0; i < y.numel(); ++i) s += y.At(i) * r.At(i);
    return s;
  };
  model->ZeroGrad();
  loss();
  model->Backward(r);
  const double h = 1e-6;
  for (auto& [name, p] : model->NamedParameters()) {
    for (int64_t i = 0; i < p->value.numel(); i += 3) {
      const double orig = p->value.At(i);
      p->value.Set(i, orig + h);
      const double lp = loss();
      p->value.Set(i, orig - h);
      const double lm = loss();
      p->value.Set(i, orig);
      const double numeric = (lp - lm) / (2 * h);
      EXPECT_NEAR(p->grad.At(i), numeric, 1e-6 + 1e-5 * std::abs(numeric)) << name << "[" << i << "]";
    }
  }
}

TEST(Model, BackwardAccumulatesUntilZeroGrad) {
  auto model = Model::Build(ResidualSpecs(), {2, 5, 4}, DType::kF64, 3);
  const Tensor x = testing::RandomTensor({3, 2, 5, 4}, 5);
  const Tensor dy = testing::RandomTensor({3, 4}, 6);
  model->ZeroGrad();
  model->Forward(x, {});
  model->Backward(dy);
  const Tensor once = model->NamedParameters()[0].param->grad.Clone();
  model->Forward(x, {});
  model->Backward(dy);
  const Tensor& twice = model->NamedParameters()[0].param->grad;
  for (int64_t i = 0; i < once.numel(); ++i) EXPECT_NEAR(twice.At(i), 2 * once.At(i), 1e-12);
}

TEST(Model, StateIsNamedByLayerWithoutPrefix) {
  auto model = Model::Build({L("conv1", "conv2d", {{"out", int64_t{2}}, {"kernel", int64_t{3}}}),
                             L("bn1", "batchnorm"), L("flat", "flatten"),
                             L("fc", "linear", {{"out", int64_t{3}}})},
                            {1, 6, 6});
  std::vector<std::string> names;
  for (auto& [n, t] : model->StateTensors()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias",
                                             "bn1.running_mean", "bn1.running_var", "fc.weight",
                                             "fc.bias"}));
  EXPECT_EQ(model->NumParameters(), 2 * 9 + 2 + 2 + 2 + 3 * 32 + 3);
}

TEST(Model, PytorchDefaultInitIsUniformInFanInBound) {
  auto model = Model::Build({L("fc", "linear", {{"out", int64_t{64}}})}, {1, 10, 10}, DType::kF32, 1);
  const Tensor& w = model->NamedParameters()[0].param->value;
  const double bound = 1.0 / std::sqrt(100.0);
  double max_abs = 0, sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    max_abs = std::max(max_abs, std::abs(w.At(i)));
    sum += w.At(i);
    sum_sq += w.At(i) * w.At(i);
  }
  EXPECT_LE(max_abs, bound);
  EXPECT_GT(max_abs, 0.95 * bound);
  // U(-b, b) has variance b^2 / 3.
  EXPECT_NEAR(sum_sq / w.numel(), bound * bound / 3, 0.1 * bound * bound / 3);
  EXPECT_NEAR(sum / w.numel(), 0.0, 0.05 * bound);
}

TEST(Model, SameSeedSameWeightsOtherSeedOther) {
  auto a = Model::Build(ResidualSpecs(), {2, 5, 4}, DType::kF32, 7);
  auto b = Model::Build(ResidualSpecs(), {2, 5, 4}, DType::kF32, 7);
  auto c = Model::Build(ResidualSpecs(), {2, 5, 4}, DType::kF32, 8);
  const Tensor& wa = a->NamedParameters()[0].param->value;
  EXPECT_EQ(MaxAbsDiff(wa, b->NamedParameters()[0].param->value), 0.0);
  EXPECT_GT(MaxAbsDiff(wa, c->NamedParameters()[0].param->value), 0.0);
}

TEST(Model, UnknownLayerTypeAndBadInputsAreConfigErrors) {
  try {
    Model::Build({L("c", "conv2dd")}, {1, 4, 4});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "layer 'c': unknown layer type 'conv2dd' (did you mean 'conv2d'?)");
  }
  try {
    Model::Build({L("r", "relu", {}, {"nope"})}, {1, 4, 4});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "layer 'r' reads 'nope', which is not an earlier layer");
  }
}

}  // namespace
}  // namespace cnnflow

namespace cnnflow {
namespace {

// Out of memory names the layer that asked (the pool capped to provoke it),
// and the pool recovers once the cap is lifted.
TEST(Model, OutOfMemoryNamesTheLayerThatAsked) {
  auto model = Model::Build({L("conv1", "conv2d", {{"out", int64_t{64}}, {"kernel", int64_t{3}},
                                                   {"pad", int64_t{1}}})},
                            {3, 61, 67}, DType::kF32, 1);
  MemoryPool& pool = PoolFor(Device::Cpu());
  struct Uncap {
    MemoryPool& p;
    ~Uncap() { p.set_limit_bytes(0); }
  } uncap{pool};
  const Tensor x = Tensor::Zeros(Shape({7, 3, 61, 67}), DType::kF32);
  pool.set_limit_bytes(pool.bytes_reserved() + 1024);  // nothing new fits
  try {
    model->Forward(x, ForwardContext{});
    FAIL() << "expected out of memory";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("host out of memory: asked"), std::string::npos) << msg;
    EXPECT_NE(msg.find("for layer 'conv1' (conv2d) forward, output [7, 64, 61, 67]"),
              std::string::npos)
        << msg;
  }
  pool.set_limit_bytes(0);
  EXPECT_EQ(model->Forward(x, ForwardContext{}).shape(), Shape({7, 64, 61, 67}));
}

}  // namespace
}  // namespace cnnflow
