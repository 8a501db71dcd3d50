// conv1d: forward and backward against naive 1D nested loops, gradient
// checks, float vs double, determinism across thread counts, shape and
// config errors, and a timing to run by hand:
//   ./tests/ops_test --gtest_also_run_disabled_tests --gtest_filter='*Conv1dBench*'
#include "ops/layers/conv1d.h"

#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "tests/ops/gradient_check.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

using testing::CheckGradients;
using testing::MakeLayer;
using testing::RandomTensor;
using testing::RunForward;

struct Case {
  int64_t n, c, l, k;  // batch, in channels, length, out channels
  int64_t kernel, stride, pad, dilation, groups;
  bool bias = true;
};

Args ConvArgs(const Case& t) {
  Args a;
  a.Set("out", t.k);
  a.Set("kernel", t.kernel);
  a.Set("stride", t.stride);
  a.Set("pad", t.pad);
  a.Set("dilation", t.dilation);
  a.Set("groups", t.groups);
  a.Set("bias", t.bias);
  return a;
}

int64_t OutLen(const Case& t) {
  return (t.l + 2 * t.pad - t.dilation * (t.kernel - 1) - 1) / t.stride + 1;
}
Shape InShape(const Case& t) { return {t.n, t.c, t.l}; }
Shape OutShape(const Case& t) { return {t.n, t.k, OutLen(t)}; }

// Naive 1D convolution in double: y [N, K, L'] flattened, with
// y[n, k, o] = b[k] + sum_{c, j} x[n, g*C/g + c, o*s - p + j*d] * w[k, c, j].
std::vector<double> NaiveConv(const Case& t, const Tensor& x, const Tensor& w, const Tensor* b) {
  const int64_t lo = OutLen(t), cg = t.c / t.groups, kg = t.k / t.groups;
  std::vector<double> y(t.n * t.k * lo);
  for (int64_t n = 0; n < t.n; ++n)
    for (int64_t k = 0; k < t.k; ++k)
      for (int64_t o = 0; o < lo; ++o) {
        double s = b ? b->At(k) : 0.0;
        for (int64_t c = 0; c < cg; ++c)
          for (int64_t j = 0; j < t.kernel; ++j) {
            const int64_t i = o * t.stride - t.pad + j * t.dilation;
            if (i < 0 || i >= t.l) continue;
            s += x.At((n * t.c + k / kg * cg + c) * t.l + i) * w.At((k * cg + c) * t.kernel + j);
          }
        y[(n * t.k + k) * lo + o] = s;
      }
  return y;
}

// Naive backward in double: dx [N, C, L], dw [K, C/g, k], db [K].
void NaiveBackward(const Case& t, const Tensor& x, const Tensor& w, const Tensor& dy,
                   std::vector<double>* dx, std::vector<double>* dw, std::vector<double>* db) {
  const int64_t lo = OutLen(t), cg = t.c / t.groups, kg = t.k / t.groups;
  dx->assign(x.numel(), 0.0);
  dw->assign(w.numel(), 0.0);
  db->assign(t.k, 0.0);
  for (int64_t n = 0; n < t.n; ++n)
    for (int64_t k = 0; k < t.k; ++k)
      for (int64_t o = 0; o < lo; ++o) {
        const double g = dy.At((n * t.k + k) * lo + o);
        (*db)[k] += g;
        for (int64_t c = 0; c < cg; ++c)
          for (int64_t j = 0; j < t.kernel; ++j) {
            const int64_t i = o * t.stride - t.pad + j * t.dilation;
            if (i < 0 || i >= t.l) continue;
            const int64_t xi = (n * t.c + k / kg * cg + c) * t.l + i;
            const int64_t wi = (k * cg + c) * t.kernel + j;
            (*dx)[xi] += g * w.At(wi);
            (*dw)[wi] += g * x.At(xi);
          }
      }
}

using testing::ExpectNear;

std::string Describe(const Case& t) {
  return StrCat("n=", t.n, " c=", t.c, " l=", t.l, " k=", t.k, " kernel ", t.kernel, " stride ",
                t.stride, " pad ", t.pad, " dil ", t.dilation, " groups ", t.groups,
                t.bias ? "" : " no bias");
}

void CheckAgainstNaive(const Case& t, DType dtype, double tol) {
  SCOPED_TRACE(StrCat(Describe(t), " ", DTypeName(dtype)));
  auto layer = MakeLayer("conv1d", ConvArgs(t), {Shape({t.c, t.l})}, dtype, 3);
  const Parameter& w = layer->parameters()[0];
  ASSERT_EQ(w.value.shape(), Shape({t.k, t.c / t.groups, t.kernel}));
  const Tensor* b = t.bias ? &layer->parameters()[1].value : nullptr;
  Tensor x = RandomTensor(InShape(t), 5, -1, 1, dtype);
  Tensor y = RunForward(*layer, {x}, OutShape(t), {});
  ExpectNear(NaiveConv(t, x, w.value, b), y, tol, "y");

  Tensor dy = RandomTensor(OutShape(t), 6, -1, 1, dtype);
  Tensor dx = Tensor::Full(InShape(t), 123.0, dtype);  // must be overwritten
  for (auto& p : layer->parameters()) p.grad.Zero();
  const Tensor* xp = &x;
  Tensor* dxp = &dx;
  layer->Backward({xp}, y, dy, {dxp});
  std::vector<double> ndx, ndw, ndb;
  NaiveBackward(t, x, w.value, dy, &ndx, &ndw, &ndb);
  ExpectNear(ndx, dx, tol, "dx");
  ExpectNear(ndw, w.grad, tol, "dweight");
  if (t.bias) ExpectNear(ndb, layer->parameters()[1].grad, tol, "dbias");
}

const std::vector<Case>& Cases() {
  //                                     n  c   l  k  ker s  p  d  g
  static const std::vector<Case> cases = {
      {1, 1, 9, 2, 3, 1, 1, 1, 1},         // batch 1, "same" padding
      {2, 3, 11, 4, 3, 2, 1, 1, 1},        // odd length, stride 2
      {3, 4, 13, 6, 3, 1, 2, 2, 2},        // dilation 2, groups 2
      {2, 4, 7, 8, 1, 1, 0, 1, 4},         // pointwise, groups 4
      {2, 2, 10, 3, 1, 3, 0, 1, 1},        // 1-tap, stride 3 (im2col path)
      {2, 2, 6, 3, 4, 1, 3, 1, 1, false},  // pad >= kernel/2, no bias
      {1, 3, 17, 3, 5, 3, 2, 2, 3},        // depthwise, stride 3, dilation 2
      {2, 1, 4, 2, 7, 1, 3, 1, 1},         // kernel longer than the input
      {2, 1, 41, 4, 8, 4, 0, 1, 1},        // audio-like: long kernel, stride 4
      {2, 2, 5, 12, 2, 1, 1, 1, 2},        // C/g*k < K/g: dW computed transposed
      // Stride 1 with C/groups >= 8: the shifted-GEMM lowering.
      {2, 8, 9, 3, 3, 1, 1, 1, 1},          // "same": a tap spans every row
      {1, 16, 7, 4, 3, 1, 0, 2, 2},         // no padding, dilation 2, groups 2
      {2, 8, 5, 2, 4, 1, 3, 1, 1, false},   // taps reading pure padding, no bias
      {3, 8, 6, 5, 1, 1, 0, 1, 1},          // pointwise
      {1, 9, 4, 3, 7, 1, 3, 1, 1},          // kernel longer than the input
      {2, 8, 11, 3, 2, 1, 2, 3, 1, false},  // even kernel, L' > L
  };
  return cases;
}

// Both lowerings are exercised by Cases(): stride 1 with >= 8 input
// channels per group takes shifted GEMMs, the rest conv2d's im2col.
TEST(Conv1dBuild, ChoosesTheLowering) {
  auto shifted = [](const Case& t) {
    auto layer = MakeLayer("conv1d", ConvArgs(t), {Shape({t.c, t.l})});
    return dynamic_cast<Conv1d&>(*layer).uses_shifted_gemm();
  };
  EXPECT_TRUE(shifted({1, 8, 9, 3, 3, 1, 1, 1, 1}));
  EXPECT_TRUE(shifted({1, 32, 20, 8, 5, 1, 0, 2, 4}));   // C/groups = 8
  EXPECT_FALSE(shifted({1, 32, 20, 8, 5, 1, 0, 2, 8}));  // C/groups = 4
  EXPECT_FALSE(shifted({1, 8, 9, 3, 3, 2, 1, 1, 1}));    // stride 2
  EXPECT_FALSE(shifted({1, 1, 90, 3, 80, 4, 0, 1, 1}));  // raw audio
  int count = 0;
  for (const Case& t : Cases()) count += shifted(t);
  EXPECT_GE(count, 5);
  EXPECT_LE(count, static_cast<int>(Cases().size()) - 5);
}

TEST(Conv1dForward, MatchesNaiveF64) {
  for (const Case& t : Cases()) CheckAgainstNaive(t, DType::kF64, 1e-12);
}

TEST(Conv1dForward, MatchesNaiveF32) {
  for (const Case& t : Cases()) CheckAgainstNaive(t, DType::kF32, 1e-5);
}

// Several batch chunks, and the shapes of the spoken-digit model (scaled
// down in length).
TEST(Conv1dForward, LargerShapesMatchNaive) {
  CheckAgainstNaive({37, 3, 29, 5, 3, 1, 1, 1, 1}, DType::kF64, 1e-12);
  CheckAgainstNaive({3, 1, 800, 8, 80, 4, 0, 1, 1}, DType::kF32, 1e-5);
  CheckAgainstNaive({3, 16, 200, 16, 3, 1, 1, 1, 1}, DType::kF32, 1e-5);
  CheckAgainstNaive({37, 8, 13, 4, 3, 1, 1, 1, 1}, DType::kF64, 1e-12);
}

TEST(Conv1dGradient, MatchesFiniteDifferences) {
  for (const Case& t : Cases()) {
    SCOPED_TRACE(Describe(t));
    auto layer = MakeLayer("conv1d", ConvArgs(t), {Shape({t.c, t.l})});
    CheckGradients(*layer, {RandomTensor(InShape(t), 11)}, OutShape(t));
  }
}

void ExpectFloatAgreesWithDouble(const Case& t) {
  auto l64 = MakeLayer("conv1d", ConvArgs(t), {Shape({t.c, t.l})}, DType::kF64, 9);
  auto l32 = MakeLayer("conv1d", ConvArgs(t), {Shape({t.c, t.l})}, DType::kF32, 9);
  Tensor x64 = RandomTensor(InShape(t), 4);
  Tensor x32 = x64.Cast(DType::kF32);
  Tensor dy64 = RandomTensor(OutShape(t), 8);
  Tensor dy32 = dy64.Cast(DType::kF32);
  auto run = [&](Layer& l, const Tensor& x, const Tensor& dy) {
    Tensor y = RunForward(l, {x}, OutShape(t), {});
    Tensor dx = Tensor::Empty(InShape(t), x.dtype());
    for (auto& p : l.parameters()) p.grad.Zero();
    const Tensor* xp = &x;
    Tensor* dxp = &dx;
    l.Backward({xp}, y, dy, {dxp});
    return std::vector<Tensor>{y, dx, l.parameters()[0].grad, l.parameters()[1].grad};
  };
  const std::vector<Tensor> a = run(*l64, x64, dy64), b = run(*l32, x32, dy32);
  const char* names[] = {"y", "dx", "dweight", "dbias"};
  for (size_t i = 0; i < a.size(); ++i) {
    double scale = 0, err = 0;
    for (int64_t j = 0; j < a[i].numel(); ++j) {
      scale = std::max(scale, std::abs(a[i].At(j)));
      err = std::max(err, std::abs(a[i].At(j) - b[i].At(j)));
    }
    EXPECT_GT(scale, 0.1) << names[i];
    EXPECT_LT(err, 1e-5 * scale) << names[i];
  }
}

// The same layer in f32 and f64 (same initial values up to rounding) gives
// the same outputs and gradients to float precision.
TEST(Conv1dForward, FloatAgreesWithDouble) {
  for (const Case& t : {Case{4, 2, 301, 8, 16, 2, 3, 1, 1}, Case{4, 16, 301, 8, 5, 1, 2, 1, 1}}) {
    SCOPED_TRACE(Describe(t));
    ExpectFloatAgreesWithDouble(t);
  }
}

TEST(Conv1dGradient, AddsIntoParameterGradsAndSkipsNullDx) {
  const Case t{3, 2, 12, 3, 3, 2, 1, 1, 1};
  auto layer = MakeLayer("conv1d", ConvArgs(t), {Shape({t.c, t.l})});
  Tensor x = RandomTensor(InShape(t), 1);
  Tensor y = RunForward(*layer, {x}, OutShape(t), {});
  Tensor dy = RandomTensor(OutShape(t), 2);
  for (auto& p : layer->parameters()) p.grad.Zero();
  const Tensor* xp = &x;
  layer->Backward({xp}, y, dy, {nullptr});
  const Tensor once = layer->parameters()[0].grad.Clone();
  const Tensor once_b = layer->parameters()[1].grad.Clone();
  layer->Backward({xp}, y, dy, {nullptr});
  for (int64_t i = 0; i < once.numel(); ++i) {
    ASSERT_NEAR(layer->parameters()[0].grad.At(i), 2 * once.At(i), 1e-12);
  }
  for (int64_t i = 0; i < once_b.numel(); ++i) {
    ASSERT_NEAR(layer->parameters()[1].grad.At(i), 2 * once_b.At(i), 1e-12);
  }
  std::vector<double> ndx, ndw, ndb;
  NaiveBackward(t, x, layer->parameters()[0].value, dy, &ndx, &ndw, &ndb);
  ExpectNear(ndw, once, 1e-12, "dweight");
  ExpectNear(ndb, once_b, 1e-12, "dbias");
}

// Gradients land in whatever tensor Parameter::grad holds when Backward
// runs (the data-parallel replicas swap in views of bucket buffers).
TEST(Conv1dGradient, WritesIntoReplacedGradTensors) {
  const Case t{2, 2, 9, 4, 3, 1, 1, 1, 1};
  auto layer = MakeLayer("conv1d", ConvArgs(t), {Shape({t.c, t.l})});
  Tensor x = RandomTensor(InShape(t), 1);
  Tensor y = RunForward(*layer, {x}, OutShape(t), {});
  Tensor dy = RandomTensor(OutShape(t), 2);
  Tensor flat = Tensor::Zeros({4 * 2 * 3 + 4}, DType::kF64);
  layer->parameters()[0].grad = flat.Slice(0, 24).Reshape({4, 2, 3});
  layer->parameters()[1].grad = flat.Slice(24, 28);
  const Tensor* xp = &x;
  layer->Backward({xp}, y, dy, {nullptr});
  std::vector<double> ndx, ndw, ndb;
  NaiveBackward(t, x, layer->parameters()[0].value, dy, &ndx, &ndw, &ndb);
  ndw.insert(ndw.end(), ndb.begin(), ndb.end());
  ExpectNear(ndw, flat, 1e-12, "flat grads");
}

void ExpectDeterministic(const Case& t) {
  auto layer = MakeLayer("conv1d", ConvArgs(t), {Shape({t.c, t.l})}, DType::kF32);
  Tensor x = RandomTensor(InShape(t), 1, -1, 1, DType::kF32);
  Tensor dy = RandomTensor(OutShape(t), 2, -1, 1, DType::kF32);
  auto grads = [&](size_t threads) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    Tensor y = RunForward(*layer, {x}, OutShape(t), {});
    Tensor dx = Tensor::Empty(InShape(t), DType::kF32);
    for (auto& p : layer->parameters()) p.grad.Zero();
    const Tensor* xp = &x;
    Tensor* dxp = &dx;
    layer->Backward({xp}, y, dy, {dxp});
    return std::vector<Tensor>{y, dx, layer->parameters()[0].grad.Clone(),
                               layer->parameters()[1].grad.Clone()};
  };
  const std::vector<Tensor> a = grads(1), b = grads(2);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].nbytes(), b[i].nbytes());
    EXPECT_EQ(0, std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].nbytes())) << "tensor " << i;
  }
}

// Weight and bias gradients (and y, dx) are bitwise equal with 1 and 2
// threads, on a batch cut into several chunks, with both lowerings.
TEST(Conv1dGradient, DeterministicAcrossThreadCounts) {
  for (const Case& t : {Case{64, 4, 257, 8, 5, 2, 2, 1, 1}, Case{64, 16, 201, 8, 3, 1, 1, 1, 2}}) {
    SCOPED_TRACE(Describe(t));
    ExpectDeterministic(t);
  }
}

TEST(Conv1dBuild, ParametersShapesAndInit) {
  const Case t{1, 6, 50, 8, 5, 2, 1, 1, 2};
  auto layer = MakeLayer("conv1d", ConvArgs(t), {Shape({6, 50})}, DType::kF32);
  EXPECT_STREQ(layer->type(), "conv1d");
  ASSERT_EQ(layer->parameters().size(), 2u);
  EXPECT_EQ(layer->parameters()[0].name, "weight");
  EXPECT_EQ(layer->parameters()[0].value.shape(), Shape({8, 3, 5}));
  EXPECT_EQ(layer->parameters()[0].grad.shape(), Shape({8, 3, 5}));
  EXPECT_EQ(layer->parameters()[1].name, "bias");
  EXPECT_EQ(layer->parameters()[1].value.shape(), Shape({8}));
  // fan_in = C/groups * k = 3 * 5 = 15: U(-1/sqrt(15), 1/sqrt(15)).
  const double bound = 1 / std::sqrt(15.0);
  double lo = 1, hi = -1;
  for (auto& p : layer->parameters()) {
    for (int64_t i = 0; i < p.value.numel(); ++i) {
      lo = std::min(lo, p.value.At(i));
      hi = std::max(hi, p.value.At(i));
    }
  }
  EXPECT_GE(lo, -bound);
  EXPECT_LE(hi, bound);
  EXPECT_LT(lo, -bound / 2);
  EXPECT_GT(hi, bound / 2);
  // L' = (50 + 2 - 5) / 2 + 1 = 24.
  EXPECT_EQ(layer->ForwardFlops(4), 2 * 4 * 8 * 15 * 24);

  Case nb = t;
  nb.bias = false;
  EXPECT_EQ(MakeLayer("conv1d", ConvArgs(nb), {Shape({6, 50})})->parameters().size(), 1u);
}

TEST(Conv1dBuild, ScalarAndListParamsAndDefaults) {
  Args a;
  a.Set("out", int64_t{32});
  a.Set("kernel", std::vector<int64_t>{80});
  a.Set("stride", int64_t{4});
  const LayerType* type = LayerRegistry::Get().Find("conv1d");
  ASSERT_NE(type, nullptr);
  a.FillDefaults(type->schema);
  auto layer = type->create("conv", a);
  // (8000 - 80) / 4 + 1 = 1981.
  EXPECT_EQ(layer->Build({Shape({1, 8000})}, DType::kF32), Shape({32, 1981}));
  auto* conv = dynamic_cast<Conv1d*>(layer.get());
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(conv->geometry().pad_w, 0);
  EXPECT_EQ(conv->geometry().dilation_w, 1);
  EXPECT_EQ(conv->geometry().groups, 1);
  EXPECT_TRUE(conv->has_bias());
}

std::string BuildError(Args a, const Shape& in) {
  try {
    MakeLayer("conv1d", std::move(a), {in});
  } catch (const ShapeError& e) {
    return e.what();
  }
  return "no ShapeError";
}

TEST(Conv1dBuild, ShapeErrorsNameTheNumbers) {
  Args a;
  a.Set("out", int64_t{8});
  a.Set("kernel", int64_t{3});
  a.Set("in", int64_t{1});
  EXPECT_EQ(BuildError(a, {3, 10}), "conv1d expects 1 input channels (in: 1), got [3, 10] with 3");
  EXPECT_EQ(BuildError(a, {1, 10}), "no ShapeError");
  EXPECT_EQ(BuildError(a, {1, 28, 28}), "conv1d expects one [C, L] input, got [1, 28, 28]");

  Args g;
  g.Set("out", int64_t{8});
  g.Set("kernel", int64_t{3});
  g.Set("groups", int64_t{2});
  EXPECT_EQ(BuildError(g, {3, 8}),
            "conv1d: input channels 3 are not divisible by groups 2 (input [3, 8])");
  g.Set("out", int64_t{7});
  EXPECT_EQ(BuildError(g, {4, 8}), "conv1d: output channels 7 (out) are not divisible by groups 2");

  Args s;
  s.Set("out", int64_t{2});
  s.Set("kernel", int64_t{5});
  s.Set("dilation", int64_t{2});
  s.Set("pad", int64_t{1});
  EXPECT_EQ(BuildError(s, {1, 6}),
            "conv1d: output length 0 <= 0: input [1, 6] padded by 1 on each side is shorter "
            "than the 9-long (dilated) kernel");
  EXPECT_EQ(BuildError(s, {1, 7}), "no ShapeError");  // 7 + 2 == 9
}

TEST(Conv1dBuild, BadParamsAreConfigErrors) {
  auto message = [](Args a) {
    try {
      MakeLayer("conv1d", std::move(a), {Shape({1, 20})});
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no ConfigError");
  };
  Args a;
  a.Set("out", int64_t{8});
  a.Set("kernel", int64_t{0});
  EXPECT_EQ(message(a), "conv1d: 'kernel' must be >= 1, got 0");
  a.Set("kernel", std::vector<int64_t>{3, 3});
  EXPECT_EQ(message(a), "parameter 'kernel' needs 1 values, got 2");
  a.Set("kernel", int64_t{3});
  a.Set("stride", int64_t{0});
  EXPECT_EQ(message(a), "conv1d: 'stride' must be >= 1, got 0");
  a.Set("stride", int64_t{1});
  a.Set("pad", int64_t{-1});
  EXPECT_EQ(message(a), "conv1d: 'pad' must be >= 0, got -1");
  a.Set("pad", int64_t{0});
  a.Set("groups", int64_t{0});
  EXPECT_EQ(message(a), "conv1d: 'groups' must be >= 1, got 0");
  a.Set("groups", int64_t{1});
  a.Set("out", int64_t{0});
  EXPECT_EQ(message(a), "conv1d: 'out' must be >= 1, got 0");
}

// Forward + backward of the spoken-digit model's conv shapes, f32. Run by
// hand; prints the best wall time with 1 and 2 threads, and the thread CPU
// time with 1 thread (steadier on a shared machine), with GFLOP/s
// (backward = 2 x the forward FLOPs, with dx).
TEST(Conv1dBench, DISABLED_SpokenDigitShapes) {
  const Case cases[] = {{64, 1, 8000, 32, 80, 4, 0, 1, 1}, {64, 32, 2000, 32, 3, 1, 1, 1, 1}};
  auto cpu_ms = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
  };
  auto wall_ms = [] {
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  for (const Case& t : cases) {
    auto layer = MakeLayer("conv1d", ConvArgs(t), {Shape({t.c, t.l})}, DType::kF32);
    Tensor x = Tensor::Full(InShape(t), 0.5, DType::kF32);
    Tensor y = Tensor::Empty(OutShape(t), DType::kF32);
    Tensor dy = Tensor::Full(OutShape(t), 0.25, DType::kF32);
    Tensor dx = Tensor::Empty(InShape(t), DType::kF32);
    const Tensor* xp = &x;
    Tensor* dxp = &dx;
    const double gflop = layer->ForwardFlops(t.n) * 1e-9;
    for (size_t threads : {1, 2}) {
      tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
      for (auto clock : {+wall_ms, +cpu_ms}) {
        if (threads > 1 && clock == +cpu_ms) continue;  // CPU time of one thread only
        double best_f = 1e30, best_b = 1e30;
        for (int rep = 0; rep < 15; ++rep) {
          const double t0 = clock();
          layer->Forward({xp}, y, {});
          const double t1 = clock();
          layer->Backward({xp}, y, dy, {dxp});
          const double t2 = clock();
          if (rep >= 2) {
            best_f = std::min(best_f, t1 - t0);
            best_b = std::min(best_b, t2 - t1);
          }
        }
        std::printf(
            "conv1d %s, %zu thread(s), %s: forward %.2f ms (%.1f GFLOP/s), backward %.2f ms "
            "(%.1f GFLOP/s), fwd+bwd %.2f ms (%.1f GFLOP/s)\n",
            Describe(t).c_str(), threads, clock == +cpu_ms ? "cpu time" : "wall", best_f,
            gflop / best_f * 1e3, best_b, 2 * gflop / best_b * 1e3, best_f + best_b,
            3 * gflop / (best_f + best_b) * 1e3);
      }
    }
  }
}

}  // namespace
}  // namespace cnnflow
