// maxpool1d, avgpool1d, and the [C, L] inputs of global_avgpool and
// batchnorm: forward and backward against naive loops, gradient checks,
// shape and config errors, and a timing to run by hand:
//   ./tests/ops_test --gtest_also_run_disabled_tests --gtest_filter='*Pool1dBench*'
#include "ops/layers/pooling1d.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
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

struct PoolCase {
  int64_t n, c, l;
  int64_t kernel, stride, pad;  // stride 0: kernel
  bool count_include_pad = true;
};

int64_t Stride(const PoolCase& t) { return t.stride == 0 ? t.kernel : t.stride; }
int64_t OutLen(const PoolCase& t) { return (t.l + 2 * t.pad - t.kernel) / Stride(t) + 1; }
Shape InShape(const PoolCase& t) { return {t.n, t.c, t.l}; }
Shape OutShape(const PoolCase& t) { return {t.n, t.c, OutLen(t)}; }

Args PoolArgs(const PoolCase& t, bool avg) {
  Args a;
  a.Set("kernel", t.kernel);
  if (t.stride != 0) a.Set("stride", t.stride);
  a.Set("pad", t.pad);
  if (avg) a.Set("count_include_pad", t.count_include_pad);
  return a;
}

std::string Describe(const PoolCase& t) {
  return StrCat("n=", t.n, " c=", t.c, " l=", t.l, " kernel ", t.kernel, " stride ", t.stride,
                " pad ", t.pad, t.count_include_pad ? "" : " exclude pad");
}

// Naive max pooling of each row: y and the input index of each max (the
// first of equal values; a NaN wins; padding never does).
void NaiveMax(const PoolCase& t, const Tensor& x, std::vector<double>* y,
              std::vector<int64_t>* arg) {
  const int64_t lo = OutLen(t), s = Stride(t);
  y->assign(t.n * t.c * lo, 0);
  arg->assign(t.n * t.c * lo, -1);
  for (int64_t r = 0; r < t.n * t.c; ++r)
    for (int64_t o = 0; o < lo; ++o) {
      double best = -std::numeric_limits<double>::infinity();
      int64_t at = -1;
      for (int64_t j = 0; j < t.kernel; ++j) {
        const int64_t i = o * s - t.pad + j;
        if (i < 0 || i >= t.l) continue;
        const double v = x.At(r * t.l + i);
        if (at < 0 || v > best || std::isnan(v)) {
          best = v;
          at = i;
        }
      }
      (*y)[r * lo + o] = best;
      (*arg)[r * lo + o] = r * t.l + at;
    }
}

// Naive average pooling: y, and dx for a given dy.
std::vector<double> NaiveAvg(const PoolCase& t, const Tensor& x, const Tensor* dy,
                             std::vector<double>* dx) {
  const int64_t lo = OutLen(t), s = Stride(t);
  std::vector<double> y(t.n * t.c * lo);
  if (dx) dx->assign(x.numel(), 0);
  for (int64_t r = 0; r < t.n * t.c; ++r)
    for (int64_t o = 0; o < lo; ++o) {
      double sum = 0;
      int64_t valid = 0, padded = 0;
      for (int64_t j = 0; j < t.kernel; ++j) {
        const int64_t i = o * s - t.pad + j;
        if (i >= -t.pad && i < t.l + t.pad) ++padded;  // PyTorch clips to the padded input
        if (i < 0 || i >= t.l) continue;
        sum += x.At(r * t.l + i);
        ++valid;
      }
      const double div = t.count_include_pad ? padded : valid;
      y[r * lo + o] = sum / div;
      if (!dx) continue;
      for (int64_t j = 0; j < t.kernel; ++j) {
        const int64_t i = o * s - t.pad + j;
        if (i >= 0 && i < t.l) (*dx)[r * t.l + i] += dy->At(r * lo + o) / div;
      }
    }
  return y;
}

using testing::ExpectNear;

const std::vector<PoolCase>& Cases() {
  //                                         n  c   l  k  s  p
  static const std::vector<PoolCase> cases = {
      {1, 1, 8, 2, 0, 0},          // batch 1, the usual k = s = 2
      {2, 3, 11, 3, 2, 1},         // odd length, overlapping, pad 1
      {2, 2, 13, 4, 0, 2},         // k = s = 4, pad = k/2 (windows of pure padding edges)
      {3, 2, 9, 5, 1, 2},          // stride 1, pad 2
      {2, 1, 7, 3, 3, 1, false},   // avg excludes padding
      {1, 2, 5, 5, 1, 0},          // kernel = input length
      {2, 2, 10, 2, 3, 1, false},  // stride > kernel (skipped cells)
      // Rows long enough for the vectorised interior loops and their tails:
      {2, 2, 75, 2, 0, 0},         // k = s = 2, odd length (last cell dropped)
      {1, 3, 70, 3, 0, 1},         // k = s = 3, pad 1
      {2, 1, 83, 4, 0, 2, false},  // k = s = 4, pad 2
      {1, 2, 67, 3, 1, 1},         // k = 3, s = 1, pad 1
      {2, 1, 59, 5, 2, 2},         // general window
  };
  return cases;
}

TEST(MaxPool1d, MatchesNaive) {
  for (DType dtype : {DType::kF64, DType::kF32}) {
    for (const PoolCase& t : Cases()) {
      SCOPED_TRACE(StrCat(Describe(t), " ", DTypeName(dtype)));
      auto layer = MakeLayer("maxpool1d", PoolArgs(t, false), {Shape({t.c, t.l})}, dtype);
      Tensor x = RandomTensor(InShape(t), 3, -1, 1, dtype);
      Tensor y = RunForward(*layer, {x}, OutShape(t), {});
      std::vector<double> want;
      std::vector<int64_t> arg;
      NaiveMax(t, x, &want, &arg);
      ExpectNear(want, y, 0, "y");
      Tensor dy = RandomTensor(OutShape(t), 4, -1, 1, dtype);
      Tensor dx = Tensor::Full(InShape(t), 7.0, dtype);  // must be overwritten
      const Tensor* xp = &x;
      Tensor* dxp = &dx;
      layer->Backward({xp}, y, dy, {dxp});
      std::vector<double> ndx(x.numel(), 0);
      for (size_t o = 0; o < arg.size(); ++o) ndx[arg[o]] += dy.At(static_cast<int64_t>(o));
      ExpectNear(ndx, dx, 1e-6, "dx");
    }
  }
}

// Ties go to the first cell of the window, and a NaN wins (PyTorch).
TEST(MaxPool1d, TiesAndNaN) {
  const PoolCase t{1, 1, 6, 3, 0, 0};
  auto layer = MakeLayer("maxpool1d", PoolArgs(t, false), {Shape({1, 6})});
  Tensor x = Tensor::Empty(InShape(t), DType::kF64);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double v[] = {2, 5, 5, nan, 9, 1};
  for (int i = 0; i < 6; ++i) x.Set(i, v[i]);
  Tensor y = RunForward(*layer, {x}, OutShape(t), {});
  EXPECT_EQ(y.At(0), 5);
  EXPECT_TRUE(std::isnan(y.At(1)));
  Tensor dy = Tensor::Full(OutShape(t), 1.0, DType::kF64);
  Tensor dx = Tensor::Empty(InShape(t), DType::kF64);
  const Tensor* xp = &x;
  Tensor* dxp = &dx;
  layer->Backward({xp}, y, dy, {dxp});
  const double want[] = {0, 1, 0, 1, 0, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(dx.At(i), want[i]) << i;
}

// The same rules on rows long enough for the vectorised loops: NaNs, ties
// and -inf at many positions, against the naive loops.
TEST(MaxPool1d, TiesAndNaNInLongRows) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dtype : {DType::kF32, DType::kF64}) {
    for (const PoolCase& t : Cases()) {
      SCOPED_TRACE(StrCat(Describe(t), " ", DTypeName(dtype)));
      auto layer = MakeLayer("maxpool1d", PoolArgs(t, false), {Shape({t.c, t.l})}, dtype);
      Tensor x = Tensor::Empty(InShape(t), dtype);
      for (int64_t i = 0; i < x.numel(); ++i) {
        const int64_t r = (i * 7919) % 13;
        x.Set(i, r == 0 ? nan : r == 1 ? -inf : static_cast<double>(r % 4));  // many ties
      }
      Tensor y = RunForward(*layer, {x}, OutShape(t), {});
      std::vector<double> want;
      std::vector<int64_t> arg;
      NaiveMax(t, x, &want, &arg);
      ExpectNear(want, y, 0, "y");
      Tensor dy = Tensor::Full(OutShape(t), 1.0, dtype);
      Tensor dx = Tensor::Empty(InShape(t), dtype);
      const Tensor* xp = &x;
      Tensor* dxp = &dx;
      layer->Backward({xp}, y, dy, {dxp});
      std::vector<double> ndx(x.numel(), 0);
      for (int64_t a : arg) ndx[a] += 1;
      ExpectNear(ndx, dx, 0, "dx (where each max came from)");
    }
  }
}

TEST(MaxPool1d, GradientMatchesFiniteDifferences) {
  for (const PoolCase& t : Cases()) {
    SCOPED_TRACE(Describe(t));
    auto layer = MakeLayer("maxpool1d", PoolArgs(t, false), {Shape({t.c, t.l})});
    // Distinct values (no ties) spaced well beyond the finite-difference step.
    Tensor x = Tensor::Empty(InShape(t), DType::kF64);
    for (int64_t i = 0; i < x.numel(); ++i) x.Set(i, std::fmod(i * 0.37, 1.9) - 0.9);
    CheckGradients(*layer, {x}, OutShape(t));
  }
}

TEST(AvgPool1d, MatchesNaive) {
  for (DType dtype : {DType::kF64, DType::kF32}) {
    for (const PoolCase& t : Cases()) {
      SCOPED_TRACE(StrCat(Describe(t), " ", DTypeName(dtype)));
      auto layer = MakeLayer("avgpool1d", PoolArgs(t, true), {Shape({t.c, t.l})}, dtype);
      Tensor x = RandomTensor(InShape(t), 3, -1, 1, dtype);
      Tensor dy = RandomTensor(OutShape(t), 4, -1, 1, dtype);
      std::vector<double> ndx;
      const std::vector<double> want = NaiveAvg(t, x, &dy, &ndx);
      const double tol = dtype == DType::kF64 ? 1e-12 : 1e-6;
      Tensor y = RunForward(*layer, {x}, OutShape(t), {});
      ExpectNear(want, y, tol, "y");
      Tensor dx = Tensor::Full(InShape(t), 7.0, dtype);
      const Tensor* xp = &x;
      Tensor* dxp = &dx;
      layer->Backward({xp}, y, dy, {dxp});
      ExpectNear(ndx, dx, tol, "dx");
    }
  }
}

TEST(AvgPool1d, GradientMatchesFiniteDifferences) {
  for (const PoolCase& t : Cases()) {
    SCOPED_TRACE(Describe(t));
    auto layer = MakeLayer("avgpool1d", PoolArgs(t, true), {Shape({t.c, t.l})});
    CheckGradients(*layer, {RandomTensor(InShape(t), 5)}, OutShape(t));
  }
}

// count_include_pad defaults to true, as in torch.nn.AvgPool1d: with
// kernel 3, pad 1, the first window [pad, x0, x1] divides by 3.
TEST(AvgPool1d, CountIncludePadDefaultsToTrue) {
  Args a;
  a.Set("kernel", int64_t{3});
  a.Set("stride", int64_t{1});
  a.Set("pad", int64_t{1});
  auto layer = MakeLayer("avgpool1d", a, {Shape({1, 4})});
  Tensor x = Tensor::Full({1, 1, 4}, 3.0, DType::kF64);
  Tensor y = RunForward(*layer, {x}, {1, 1, 4}, {});
  EXPECT_DOUBLE_EQ(y.At(0), 2.0);
  EXPECT_DOUBLE_EQ(y.At(1), 3.0);
  EXPECT_DOUBLE_EQ(y.At(3), 2.0);
}

TEST(Pooling1dBuild, ShapesDefaultsAndErrors) {
  const LayerType* type = LayerRegistry::Get().Find("maxpool1d");
  ASSERT_NE(type, nullptr);
  Args a;
  a.Set("kernel", std::vector<int64_t>{4});
  a.FillDefaults(type->schema);
  auto layer = type->create("pool", a);
  EXPECT_STREQ(layer->type(), "maxpool1d");
  EXPECT_EQ(layer->Build({Shape({32, 1981})}, DType::kF32), Shape({32, 495}));  // stride = kernel
  EXPECT_TRUE(layer->parameters().empty());

  auto shape_error = [](const std::string& type, Args args, const Shape& in) {
    try {
      MakeLayer(type, std::move(args), {in});
    } catch (const ShapeError& e) {
      return std::string(e.what());
    }
    return std::string("no ShapeError");
  };
  Args k5;
  k5.Set("kernel", int64_t{5});
  EXPECT_EQ(shape_error("maxpool1d", k5, {3, 10, 10}),
            "maxpool1d expects one [C, L] input, got [3, 10, 10]");
  EXPECT_EQ(shape_error("avgpool1d", k5, {3, 4}),
            "avgpool1d: input [3, 4] padded by 0 on each side is shorter than the kernel 5");
  k5.Set("pad", int64_t{1});
  EXPECT_EQ(shape_error("avgpool1d", k5, {3, 3}), "no ShapeError");  // 3 + 2 == 5

  auto config_error = [](const std::string& type, Args args) {
    try {
      MakeLayer(type, std::move(args), {Shape({1, 20})});
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no ConfigError");
  };
  Args bad;
  bad.Set("kernel", int64_t{0});
  EXPECT_EQ(config_error("maxpool1d", bad), "maxpool1d: 'kernel' must be >= 1, got 0");
  bad.Set("kernel", int64_t{4});
  bad.Set("pad", int64_t{3});
  EXPECT_EQ(config_error("avgpool1d", bad),
            "avgpool1d: 'pad' 3 must be at most half of 'kernel' 4");
  bad.Set("pad", int64_t{0});
  bad.Set("stride", std::vector<int64_t>{2, 2});
  EXPECT_EQ(config_error("maxpool1d", bad), "parameter 'stride' needs 1 values, got 2");
}

// global_avgpool takes [C, L]: [N, C, L] -> [N, C], the mean over L.
TEST(GlobalAvgPool1d, MeanOverLength) {
  const int64_t n = 3, c = 4, l = 37;
  auto layer = MakeLayer("global_avgpool", Args(), {Shape({c, l})});
  Tensor x = RandomTensor({n, c, l}, 8);
  Tensor y = RunForward(*layer, {x}, {n, c}, {});
  for (int64_t r = 0; r < n * c; ++r) {
    double s = 0;
    for (int64_t i = 0; i < l; ++i) s += x.At(r * l + i);
    EXPECT_NEAR(y.At(r), s / l, 1e-12) << r;
  }
  CheckGradients(*layer, {x}, {n, c});
}

// batchnorm takes [C, L] (BatchNorm1d): in training each channel is
// normalised over the batch and the length.
TEST(BatchNorm1d, NormalisesOverBatchAndLength) {
  const int64_t n = 3, c = 2, l = 7;
  auto layer = MakeLayer("batchnorm", Args(), {Shape({c, l})});
  Tensor x = RandomTensor({n, c, l}, 9, -2, 3);
  Tensor y = RunForward(*layer, {x}, {n, c, l}, {});
  for (int64_t ch = 0; ch < c; ++ch) {
    double mean = 0, var = 0;
    for (int64_t s = 0; s < n; ++s)
      for (int64_t i = 0; i < l; ++i) mean += x.At((s * c + ch) * l + i);
    mean /= n * l;
    for (int64_t s = 0; s < n; ++s)
      for (int64_t i = 0; i < l; ++i) var += std::pow(x.At((s * c + ch) * l + i) - mean, 2);
    var /= n * l;
    for (int64_t s = 0; s < n; ++s)
      for (int64_t i = 0; i < l; ++i) {
        const int64_t k = (s * c + ch) * l + i;
        EXPECT_NEAR(y.At(k), (x.At(k) - mean) / std::sqrt(var + 1e-5), 1e-9) << k;
      }
  }
  CheckGradients(*layer, {x}, {n, c, l});
}

// Forward + backward of pooling on a spoken-digit-sized map, f32. Run by hand.
TEST(Pool1dBench, DISABLED_SpokenDigitShapes) {
  const PoolCase t{64, 32, 1981, 4, 0, 0};
  for (const char* type : {"maxpool1d", "avgpool1d"}) {
    auto layer = MakeLayer(type, PoolArgs(t, std::string(type) == "avgpool1d"), {Shape({t.c, t.l})},
                           DType::kF32);
    Tensor x = RandomTensor(InShape(t), 1, -1, 1, DType::kF32);
    Tensor y = Tensor::Empty(OutShape(t), DType::kF32);
    Tensor dy = RandomTensor(OutShape(t), 2, -1, 1, DType::kF32);
    Tensor dx = Tensor::Empty(InShape(t), DType::kF32);
    const Tensor* xp = &x;
    Tensor* dxp = &dx;
    double best_f = 1e30, best_b = 1e30;
    for (int rep = 0; rep < 12; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      layer->Forward({xp}, y, {});
      const auto t1 = std::chrono::steady_clock::now();
      layer->Backward({xp}, y, dy, {dxp});
      const auto t2 = std::chrono::steady_clock::now();
      best_f = std::min(best_f, std::chrono::duration<double, std::milli>(t1 - t0).count());
      best_b = std::min(best_b, std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    std::printf("%s %s: forward %.2f ms, backward %.2f ms (%.2f GB/s forward read)\n", type,
                Describe(t).c_str(), best_f, best_b, x.nbytes() / best_f * 1e-6);
  }
}

}  // namespace
}  // namespace cnnflow
