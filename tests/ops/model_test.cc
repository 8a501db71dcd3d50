// The model DAG: layers by name, residual fan-out (gradients sum), whole-
// model gradients against finite differences, init and state naming.
#include "ops/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "ops/cpu/elementwise.h"
#include "ops/cpu/onednn.h"
#include "ops/device.h"
#include "tests/ops/gradient_check.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

using testing::Spec;

// conv -> relu -> conv, with a residual add of the relu output: relu1 feeds
// two layers, so its gradient is a sum.
std::vector<LayerSpec> ResidualSpecs() {
  return {
      Spec("conv1", "conv2d", {{"out", int64_t{3}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Spec("relu1", "relu"),
      Spec("conv2", "conv2d", {{"out", int64_t{3}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Spec("res", "add", {}, {"conv2", "relu1"}),
      Spec("flat", "flatten"),
      Spec("fc", "linear", {{"out", int64_t{4}}})};
}

// Every `stride`-th element of every parameter gradient of a forward and
// backward of sum(y * R) against central differences (f64).
void ExpectGradientsMatchFiniteDifferences(Model& model, const Tensor& x, const Tensor& r,
                                           int64_t stride) {
  ForwardContext ctx;
  auto loss = [&] {
    const Tensor& y = model.Forward(x, ctx);
    double s = 0;
    for (int64_t i = 0; i < y.numel(); ++i) s += y.At(i) * r.At(i);
    return s;
  };
  model.ZeroGrad();
  loss();
  model.Backward(r);
  const double h = 1e-6;
  for (auto& [name, p, layer_type] : model.NamedParameters()) {
    for (int64_t i = 0; i < p->value.numel(); i += stride) {
      const double orig = p->value.At(i);
      p->value.Set(i, orig + h);
      const double lp = loss();
      p->value.Set(i, orig - h);
      const double lm = loss();
      p->value.Set(i, orig);
      const double numeric = (lp - lm) / (2 * h);
      EXPECT_NEAR(p->grad.At(i), numeric, 1e-6 + 1e-5 * std::abs(numeric))
          << name << "[" << i << "]";
    }
  }
}

TEST(Model, ResidualModelGradientsMatchFiniteDifferences) {
  auto model = Model::Build(ResidualSpecs(), {2, 5, 4}, {.dtype = DType::kF64, .seed = 3});
  EXPECT_EQ(model->output_shape(), Shape({4}));
  ExpectGradientsMatchFiniteDifferences(*model, testing::RandomTensor({2, 2, 5, 4}, 5),
                                        testing::RandomTensor({2, 4}, 6), 3);
}

TEST(Model, BackwardAccumulatesUntilZeroGrad) {
  auto model = Model::Build(ResidualSpecs(), {2, 5, 4}, {.dtype = DType::kF64, .seed = 3});
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
  auto model = Model::Build({Spec("conv1", "conv2d", {{"out", int64_t{2}}, {"kernel", int64_t{3}}}),
                             Spec("bn1", "batchnorm"), Spec("flat", "flatten"),
                             Spec("fc", "linear", {{"out", int64_t{3}}})},
                            {1, 6, 6});
  std::vector<std::string> names;
  for (auto& [n, t] : model->StateTensors()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias",
                                             "bn1.running_mean", "bn1.running_var", "fc.weight",
                                             "fc.bias"}));
  EXPECT_EQ(model->NumParameters(), 2 * 9 + 2 + 2 + 2 + 3 * 32 + 3);
}

TEST(Model, PytorchDefaultInitIsUniformInFanInBound) {
  auto model =
      Model::Build({Spec("fc", "linear", {{"out", int64_t{64}}})}, {1, 10, 10}, {.seed = 1});
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
  auto a = Model::Build(ResidualSpecs(), {2, 5, 4}, {.seed = 7});
  auto b = Model::Build(ResidualSpecs(), {2, 5, 4}, {.seed = 7});
  auto c = Model::Build(ResidualSpecs(), {2, 5, 4}, {.seed = 8});
  const Tensor& wa = a->NamedParameters()[0].param->value;
  EXPECT_EQ(MaxAbsDiff(wa, b->NamedParameters()[0].param->value), 0.0);
  EXPECT_GT(MaxAbsDiff(wa, c->NamedParameters()[0].param->value), 0.0);
}

// The one set of rules every command reads weights by.
TEST(StateDict, ReadsPyTorchNamesStrictlyAndListsWhatDoesNotFit) {
  const Tensor w = Tensor::Full(Shape{2, 3}, 1), b = Tensor::Full(Shape{2}, 2);
  const std::vector<std::pair<std::string, Tensor>> model = {{"fc.weight", w}, {"fc.bias", b}};
  // DDP's "module.", BN's counter and a run's weight average are not the model's tensors.
  const StateDictMatch ddp =
      MatchStateDict({{"module.fc.weight", w},
                      {"module.fc.bias", b},
                      {"module.bn.num_batches_tracked", Tensor::Full(Shape{1}, 5)},
                      {"ema.fc.weight", w}},
                     model);
  EXPECT_TRUE(ddp.mismatches.empty()) << ListMismatches(ddp);
  ASSERT_EQ(ddp.tensors.size(), 2u);
  EXPECT_EQ(ddp.tensors[0].first, "fc.weight");
  // The prefix reads the average, and only it.
  StateDictRules ema;
  ema.prefix = "ema.";
  const StateDictMatch avg =
      MatchStateDict({{"fc.weight", w}, {"ema.fc.weight", w}, {"ema.fc.bias", b}}, model, ema);
  EXPECT_TRUE(avg.mismatches.empty()) << ListMismatches(avg);
  // Missing, unexpected and misshapen tensors, one line each.
  const StateDictMatch bad =
      MatchStateDict({{"fc.weight", Tensor::Full(Shape{3, 2}, 1)}, {"head.weight", w}}, model);
  ASSERT_EQ(bad.mismatches.size(), 3u);
  const std::string list = ListMismatches(bad);
  EXPECT_NE(list.find("'fc.weight' is [3, 2] in the file, [2, 3] in the model"), std::string::npos)
      << list;
  EXPECT_NE(list.find("the model's 'fc.bias' [2] is not in the file"), std::string::npos) << list;
  EXPECT_NE(list.find("the file's 'head.weight' [2, 3] is not in the model"), std::string::npos)
      << list;
  // skip: neither read nor missed.
  StateDictRules skip;
  skip.skip = {"fc.b*"};
  EXPECT_TRUE(MatchStateDict({{"fc.weight", w}}, model, skip).mismatches.empty());
}

TEST(Model, UnknownLayerTypeAndBadInputsAreConfigErrors) {
  try {
    Model::Build({Spec("c", "conv2dd")}, {1, 4, 4});
    FAIL();
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(
        msg.rfind("layer 'c': unknown layer type 'conv2dd' (did you mean 'conv2d'?); known: ", 0),
        0u)
        << msg;
    EXPECT_NE(msg.find(", relu, "), std::string::npos) << msg;  // the list of every type
  }
  try {
    Model::Build({Spec("r", "relu", {}, {"nope"})}, {1, 4, 4});
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
  auto model =
      Model::Build({Spec("conv1", "conv2d",
                         {{"out", int64_t{64}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}})},
                   {3, 61, 67}, {.seed = 1});
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
    EXPECT_NE(msg.find(" bytes available (MemAvailable)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("use a smaller batch (train.batch)"), std::string::npos) << msg;
  }
  pool.set_limit_bytes(0);
  EXPECT_EQ(model->Forward(x, ForwardContext{}).shape(), Shape({7, 64, 61, 67}));
}

}  // namespace
}  // namespace cnnflow

namespace cnnflow {
namespace {

// Evaluation's forward (keep_activations = false): the output of a forward
// that keeps everything, each activation back in the pool once its last
// reader has run, and no Backward after it.

ForwardContext FreeingContext() {
  ForwardContext ctx;
  ctx.training = false;
  ctx.keep_activations = false;
  return ctx;
}

// conv1 -> relu1 -> conv2 -> relu2 -> add(relu2, relu1) -> pool -> fc: relu1
// is read by conv2 and, two layers later, by the add. Its maps all have one
// shape, so a block freed after its first reader would be relu2's output
// and the add would read relu2 twice.
std::vector<LayerSpec> FanOutSpecs() {
  return {
      Spec("conv1", "conv2d", {{"out", int64_t{3}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Spec("relu1", "relu"),
      Spec("conv2", "conv2d", {{"out", int64_t{3}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Spec("relu2", "relu"),
      Spec("res", "add", {}, {"relu2", "relu1"}),
      Spec("pool", "maxpool2d", {{"kernel", int64_t{2}}}),
      Spec("flat", "flatten"),
      Spec("fc", "linear", {{"out", int64_t{4}}})};
}

TEST(Model, ForwardWithoutKeepingActivationsGivesTheSameOutput) {
  for (const DType dtype : {DType::kF64, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    // No BN or dropout: training and evaluation mode compute the same.
    auto model = Model::Build(FanOutSpecs(), {2, 6, 6}, {.dtype = dtype, .seed = 3});
    const Tensor x = testing::RandomTensor({5, 2, 6, 6}, 11, -1, 1, dtype);
    const Tensor kept = model->Forward(x, ForwardContext{}).Clone();
    const Tensor freed = model->Forward(x, FreeingContext()).Clone();
    ASSERT_EQ(freed.shape(), Shape({5, 4}));
    for (int64_t i = 0; i < kept.numel(); ++i) ASSERT_EQ(freed.At(i), kept.At(i)) << i;
    // Again, on blocks the first freeing forward gave back, then training.
    EXPECT_EQ(MaxAbsDiff(model->Forward(x, FreeingContext()), kept), 0.0);
    EXPECT_EQ(MaxAbsDiff(model->Forward(x, ForwardContext{}), kept), 0.0);
  }
}

// Model::Backward skips the layers that need no gradient (frozen, or held
// by their optimizer group, with nothing trainable upstream): conv1 and its
// ReLU here; conv2 and the add get no dx for relu1. The other gradients are
// bitwise those of the fully trainable model, and conv1's stay untouched;
// asked for dx of the data, conv1 runs again.
TEST(Model, BackwardSkipsWhatNeedsNoGradient) {
  for (const bool held : {false, true}) {
    SCOPED_TRACE(held ? "held" : "frozen");
    auto all = Model::Build(FanOutSpecs(), {2, 6, 6}, {.seed = 3});
    auto part = Model::Build(FanOutSpecs(), {2, 6, 6}, {.seed = 3});
    for (Parameter& p : part->FindLayer("conv1")->parameters()) {
      if (held) {
        p.held = true;
      } else {
        p.trainable = false;
      }
    }
    const Tensor x = testing::RandomTensor({5, 2, 6, 6}, 11, -1, 1, DType::kF32);
    const Tensor dy = testing::RandomTensor({5, 4}, 12, -1, 1, DType::kF32);
    for (auto* m : {all.get(), part.get()}) {
      m->ZeroGrad();
      m->Forward(x, {});
      m->Backward(dy);
    }
    const auto want = all->NamedParameters(), got = part->NamedParameters();
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE(got[i].name);
      const double grad_max =
          MaxAbsDiff(got[i].param->grad, Tensor::Zeros(got[i].param->grad.shape()));
      if (got[i].name.rfind("conv1.", 0) == 0) {
        EXPECT_EQ(grad_max, 0.0) << "a layer that needs no gradient ran";
        EXPECT_GT(MaxAbsDiff(want[i].param->grad, got[i].param->grad), 0.0);
      } else {
        EXPECT_GT(grad_max, 0.0);
        EXPECT_EQ(MaxAbsDiff(want[i].param->grad, got[i].param->grad), 0.0);
      }
    }
    Tensor dx_all, dx_part;
    all->Forward(x, {});
    all->Backward(dy, {}, &dx_all);
    part->ZeroGrad();
    part->Forward(x, {});
    part->Backward(dy, {}, &dx_part);
    EXPECT_EQ(MaxAbsDiff(dx_all, dx_part), 0.0);
    EXPECT_GT(MaxAbsDiff(part->FindLayer("conv1")->parameters()[0].grad,
                         Tensor::Zeros(part->FindLayer("conv1")->parameters()[0].grad.shape())),
              0.0)
        << "with dx asked for, conv1's backward runs (and computes its gradients)";
  }
}

TEST(Model, ForwardWithoutKeepingActivationsFreesThemAsItGoes) {
  // fc1 relu1 ... fc4 relu4 fc5: eight [512, 128] f32 activations of
  // 256 KiB (a size class of the pool exactly), then [512, 10] logits.
  std::vector<LayerSpec> specs;
  for (int k = 1; k <= 4; ++k) {
    specs.push_back(Spec(StrCat("fc", k), "linear", {{"out", int64_t{128}}}));
    specs.push_back(Spec(StrCat("relu", k), "relu"));
  }
  specs.push_back(Spec("fc5", "linear", {{"out", int64_t{10}}}));
  const int64_t n = 512;
  const size_t act = n * 128 * sizeof(float);
  const size_t all = 8 * act;
  MemoryPool& pool = PoolFor(Device::Cpu());
  const Tensor x = testing::RandomTensor({n, 128}, 3, -1, 1, DType::kF32);
  struct Use {
    size_t peak, after;  // above what was in use before the forward
  };
  auto forward = [&](const ForwardContext& ctx) {
    auto model = Model::Build(specs, {128}, {.seed = 1});
    const size_t before = pool.bytes_in_use();
    pool.ResetPeak();
    model->Forward(x, ctx);
    return Use{pool.peak_bytes_in_use() - before, pool.bytes_in_use() - before};
  };
  const Use kept = forward(ForwardContext{});
  EXPECT_GE(kept.peak, all) << "the pool's figures see every kept activation";
  EXPECT_GE(kept.after, all);
  const Use freed = forward(FreeingContext());
  // At most a layer's input and output at once, and only the logits after.
  EXPECT_LE(freed.peak, 2 * act) << "of " << all << " bytes of activations";
  EXPECT_LT(freed.after, act);
}

TEST(Model, BackwardAfterForwardWithoutActivationsIsAnError) {
  auto model = Model::Build(ResidualSpecs(), {2, 5, 4}, {.dtype = DType::kF64, .seed = 3});
  const Tensor x = testing::RandomTensor({3, 2, 5, 4}, 5);
  const Tensor dy = testing::RandomTensor({3, 4}, 6);
  model->ZeroGrad();
  model->Forward(x, FreeingContext());
  try {
    model->Backward(dy);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("Backward after a Forward that did not keep its activations"),
        std::string::npos)
        << e.what();
  }
  for (int64_t i = 0; i < model->NamedParameters()[0].param->grad.numel(); ++i) {
    ASSERT_EQ(model->NamedParameters()[0].param->grad.At(i), 0.0) << "gradients touched";
  }
  // A forward that keeps them, in either mode, makes Backward work again.
  model->Forward(x, ForwardContext{});
  EXPECT_NO_THROW(model->Backward(dy));
  ForwardContext frozen;
  frozen.training = false;  // evaluation mode, activations kept (frozen BN)
  model->Forward(x, frozen);
  EXPECT_NO_THROW(model->Backward(dy));
}

// A ResNet block and a conv tail: bn1 -> relu1 (relu1 then feeds two
// layers), add -> relu2 and conv3 -> relu3 fuse; relu4 reads a conv that
// another layer reads too, so it stays a layer.
std::vector<LayerSpec> FusableSpecs() {
  auto conv = [](const char* name, std::vector<std::string> in = {}) {
    return Spec(name, "conv2d", {{"out", int64_t{4}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}},
                std::move(in));
  };
  return {conv("conv1"),
          Spec("bn1", "batchnorm"),
          Spec("relu1", "relu"),
          conv("conv2"),
          Spec("bn2", "batchnorm"),
          Spec("res", "add", {}, {"bn2", "relu1"}),
          Spec("relu2", "relu"),
          conv("conv3"),
          Spec("relu3", "relu"),
          conv("conv4"),
          Spec("relu4", "relu"),
          Spec("res2", "add", {}, {"relu4", "conv4"}),
          Spec("flat", "flatten"),
          Spec("fc", "linear", {{"out", int64_t{3}}})};
}

// "activation->layer" for each fused activation of `model`.
std::vector<std::string> FusedPairs(const Model& model) {
  std::vector<std::string> fused;
  for (int i = 0; i < model.num_layers(); ++i) {
    if (model.fused_into(i) >= 0) {
      fused.push_back(model.layer(i).name() + "->" + model.layer(model.fused_into(i)).name());
    }
  }
  return fused;
}

TEST(Model, ReluFusionPicksTheOnlyReaderCases) {
  auto model = Model::Build(FusableSpecs(), {2, 5, 4}, {.dtype = DType::kF64, .seed = 3});
  EXPECT_EQ(FusedPairs(*model),
            (std::vector<std::string>{"relu1->bn1", "relu2->res", "relu3->conv3"}));
  auto plain = Model::Build(FusableSpecs(), {2, 5, 4},
                            {.dtype = DType::kF64, .seed = 3, .fuse_activations = false});
  for (int i = 0; i < plain->num_layers(); ++i) EXPECT_EQ(plain->fused_into(i), -1);
}

// The fused model computes what the unfused one does: outputs, the input
// gradient and every parameter gradient, in f64 and f32 (within f32_tol),
// for two steps (the second reuses the aliased activations).
void ExpectFusedModelMatchesUnfused(const std::vector<LayerSpec>& specs, const Shape& sample,
                                    int64_t outputs, double f32_tol,
                                    const ForwardContext& ctx = {}) {
  for (const DType dtype : {DType::kF64, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto fused = Model::Build(specs, sample, {.dtype = dtype, .seed = 3});
    auto plain =
        Model::Build(specs, sample, {.dtype = dtype, .seed = 3, .fuse_activations = false});
    const double tol = dtype == DType::kF64 ? 1e-12 : f32_tol;
    for (int step = 0; step < 2; ++step) {
      const Tensor x = testing::RandomTensor(sample.WithBatch(6), 5 + step, -1, 1, dtype);
      const Tensor dy = testing::RandomTensor({6, outputs}, 6 + step, -1, 1, dtype);
      Tensor dx_a, dx_b;
      fused->ZeroGrad();
      plain->ZeroGrad();
      const Tensor ya = fused->Forward(x, ctx).Clone();
      const Tensor yb = plain->Forward(x, ctx).Clone();
      fused->Backward(dy, {}, &dx_a);
      plain->Backward(dy, {}, &dx_b);
      for (int64_t i = 0; i < ya.numel(); ++i) ASSERT_NEAR(ya.At(i), yb.At(i), tol) << i;
      for (int64_t i = 0; i < dx_a.numel(); ++i) ASSERT_NEAR(dx_a.At(i), dx_b.At(i), tol) << i;
      auto pa = fused->NamedParameters(), pb = plain->NamedParameters();
      ASSERT_EQ(pa.size(), pb.size());
      for (size_t k = 0; k < pa.size(); ++k) {
        for (int64_t i = 0; i < pa[k].param->grad.numel(); ++i) {
          ASSERT_NEAR(pa[k].param->grad.At(i), pb[k].param->grad.At(i),
                      tol * (1 + std::abs(pb[k].param->grad.At(i))))
              << pa[k].name << "[" << i << "]";
        }
      }
    }
  }
}

TEST(Model, FusedReluModelMatchesUnfused) {
  ExpectFusedModelMatchesUnfused(FusableSpecs(), {2, 5, 4}, 3, 1e-5);
}

// The speed run's pattern: conv -> bn1 -> gelu1 fuses; gelu2 (the tanh
// form) stays a layer, and so does gelu3, whose batchnorm the residual add
// reads too.
std::vector<LayerSpec> GeluFusableSpecs() {
  auto conv = [](const char* name) {
    return Spec(name, "conv2d", {{"out", int64_t{4}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}});
  };
  return {conv("conv1"),
          Spec("bn1", "batchnorm"),
          Spec("gelu1", "gelu"),
          conv("conv2"),
          Spec("bn2", "batchnorm"),
          Spec("gelu2", "gelu", {{"approximate", std::string("tanh")}}),
          Spec("bn3", "batchnorm"),
          Spec("gelu3", "gelu"),
          Spec("res", "add", {}, {"gelu3", "bn3"}),
          Spec("flat", "flatten"),
          Spec("fc", "linear", {{"out", int64_t{3}}})};
}

TEST(Model, GeluFusionTakesTheErfFormOfTheOnlyReader) {
  auto model = Model::Build(GeluFusableSpecs(), {2, 7, 7}, {.dtype = DType::kF64, .seed = 3});
  EXPECT_EQ(FusedPairs(*model), (std::vector<std::string>{"gelu1->bn1"}));
}

TEST(Model, FusedGeluModelMatchesUnfused) {
  ExpectFusedModelMatchesUnfused(GeluFusableSpecs(), {2, 7, 7}, 3, 2e-5);
  ForwardContext eval;
  eval.training = false;
  ExpectFusedModelMatchesUnfused(GeluFusableSpecs(), {2, 7, 7}, 3, 2e-5, eval);
}

TEST(Model, FusedGeluModelGradientsMatchFiniteDifferences) {
  auto model = Model::Build(GeluFusableSpecs(), {2, 7, 7}, {.dtype = DType::kF64, .seed = 3});
  ExpectGradientsMatchFiniteDifferences(*model, testing::RandomTensor({3, 2, 7, 7}, 5),
                                        testing::RandomTensor({3, 3}, 6), 5);
}

// Backward through the fused model against central differences (f64).
TEST(Model, FusedReluModelGradientsMatchFiniteDifferences) {
  auto model = Model::Build(FusableSpecs(), {2, 5, 4}, {.dtype = DType::kF64, .seed = 3});
  ExpectGradientsMatchFiniteDifferences(*model, testing::RandomTensor({3, 2, 5, 4}, 5),
                                        testing::RandomTensor({3, 3}, 6), 5);
}

}  // namespace
}  // namespace cnnflow

namespace cnnflow {
namespace {

// f32 with graph.channels_last: true (MemoryFormat::kChannelsLast): the
// activations between the layers that can take them are [N, H, W, C], and
// oneDNN's convolutions read and write them as they are (AVX-512). The
// default NCHW model, on other kernels (GEMM or blocked oneDNN), is the
// reference: the same outputs and gradients up to the order of the sums.
std::vector<LayerSpec> ChannelsLastF32Specs() {
  auto conv = [](const char* name, int64_t out, int64_t kernel, int64_t stride, bool bias) {
    return Spec(name, "conv2d",
                {{"out", out},
                 {"kernel", kernel},
                 {"pad", kernel / 2},
                 {"stride", stride},
                 {"bias", bias}});
  };
  return {conv("conv1", 16, 3, 1, true),  Spec("pool1", "maxpool2d", {{"kernel", int64_t{2}}}),
          Spec("bn1", "batchnorm"),       Spec("gelu1", "gelu"),
          conv("conv2", 16, 3, 1, false), Spec("bn2", "batchnorm"),
          Spec("relu2", "relu"),          Spec("res", "add", {}, {"relu2", "gelu1"}),
          conv("conv3", 32, 3, 2, false), Spec("scale", "mul", {{"scale", 0.5}}),
          conv("conv4", 32, 1, 1, false), Spec("relu4", "relu"),
          Spec("flat", "flatten"),        Spec("fc", "linear", {{"out", int64_t{5}}})};
}

TEST(Model, F32ChannelsLastMatchesNchw) {
  const Shape in{3, 12, 12};
  auto nchw = Model::Build(ChannelsLastF32Specs(), in, {.seed = 3});
  for (int i = 0; i < nchw->num_layers(); ++i) {
    EXPECT_FALSE(nchw->layer(i).nhwc_input() || nchw->layer(i).nhwc_output())
        << "f32 stays NCHW unless asked: " << nchw->layer(i).name();
  }
  if (!cpu::OnednnHasAvx512Core()) {
    GTEST_SKIP() << "f32 convolutions go channels-last only where oneDNN runs AVX-512; "
                    "this CPU's oneDNN does not";
  }
  auto nhwc = Model::Build(ChannelsLastF32Specs(), in,
                           {.seed = 3, .memory_format = MemoryFormat::kChannelsLast});
  // Every activation from conv1's output to conv4's input is NHWC; conv4's
  // output goes through relu4 to flatten, which reads NCHW.
  for (int i = 0; i < nhwc->num_layers(); ++i) {
    const std::string& name = nhwc->layer(i).name();
    EXPECT_EQ(nhwc->layer(i).nhwc_input(), i >= 1 && i <= 10) << name;
    EXPECT_EQ(nhwc->layer(i).nhwc_output(), i <= 9) << name;
  }
  // Chunks of several samples, and of one more than others (n % chunks).
  for (const int64_t n : {int64_t{7}, int64_t{64}}) {
    SCOPED_TRACE(n);
    const Tensor x = testing::RandomTensor({n, 3, 12, 12}, 4, -1, 1, DType::kF32);
    const Tensor dy = testing::RandomTensor({n, 5}, 5, -1, 1, DType::kF32);
    Model* models[2] = {nchw.get(), nhwc.get()};
    Tensor eval[2], train[2];
    for (int k = 0; k < 2; ++k) {
      ForwardContext ctx;
      ctx.training = false;
      eval[k] = models[k]->Forward(x, ctx).Clone();
      train[k] = models[k]->Forward(x, ForwardContext{}).Clone();
      models[k]->ZeroGrad();
      models[k]->Backward(dy);
    }
    EXPECT_LE(MaxAbsDiff(eval[1], eval[0]), 1e-4);
    EXPECT_LE(MaxAbsDiff(train[1], train[0]), 1e-4);
    const auto a = nchw->NamedParameters(), b = nhwc->NamedParameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      double scale = 0;
      for (int64_t j = 0; j < a[i].param->grad.numel(); ++j)
        scale = std::max(scale, std::abs(a[i].param->grad.At(j)));
      EXPECT_LE(MaxAbsDiff(b[i].param->grad, a[i].param->grad), 1e-4 * std::max(1.0, scale))
          << a[i].name;
    }
  }
}

}  // namespace
}  // namespace cnnflow
