// maxpool2d, avgpool2d and global_avgpool: forward against naive loops
// (PyTorch's semantics), gradient checks, argmax routing, shape errors.
#include "ops/layers/pooling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "ops/cpu/isa.h"
#include "tests/ops/gradient_check.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

using testing::CheckGradients;
using testing::MakeLayer;
using testing::RandomTensor;
using testing::RunForward;

struct PoolCase {
  int64_t n, c, h, w;
  int64_t kh, kw, sh, sw, ph, pw;
};

Args PoolArgs(const PoolCase& t) {
  Args a;
  a.Set("kernel", std::vector<int64_t>{t.kh, t.kw});
  a.Set("stride", std::vector<int64_t>{t.sh, t.sw});
  a.Set("pad", std::vector<int64_t>{t.ph, t.pw});
  return a;
}

int64_t OutSize(int64_t in, int64_t k, int64_t s, int64_t p) { return (in + 2 * p - k) / s + 1; }
Shape InShape(const PoolCase& t) { return {t.n, t.c, t.h, t.w}; }
Shape OutShape(const PoolCase& t) {
  return {t.n, t.c, OutSize(t.h, t.kh, t.sh, t.ph), OutSize(t.w, t.kw, t.sw, t.pw)};
}

const std::vector<PoolCase>& Cases() {
  //                                n  c  h  w kh kw sh sw ph pw
  static const std::vector<PoolCase> cases = {
      {2, 3, 6, 6, 2, 2, 2, 2, 0, 0},   // the model's 2x2/2
      {1, 2, 7, 5, 2, 2, 2, 2, 0, 0},   // odd sizes: last row/column dropped, batch 1
      {2, 2, 7, 7, 3, 3, 2, 2, 1, 1},   // ResNet-style 3x3/2 pad 1
      {1, 3, 5, 8, 2, 3, 1, 2, 1, 1},   // rectangular, overlapping, padded
      {3, 1, 4, 4, 4, 4, 4, 4, 2, 2},   // windows mostly padding
      {1, 1, 9, 11, 3, 2, 3, 1, 0, 1},  // stride 3
  };
  return cases;
}

// A tensor of distinct values (a shuffled ramp): no ties, so max pooling is
// differentiable everywhere the gradient check probes.
Tensor DistinctTensor(const Shape& shape, uint64_t seed, DType dtype = DType::kF64) {
  Tensor t = Tensor::Empty(shape, dtype);
  std::vector<int64_t> perm(t.numel());
  std::iota(perm.begin(), perm.end(), 0);
  Rng rng(seed);
  for (int64_t i = t.numel() - 1; i > 0; --i) {
    std::swap(perm[i], perm[rng.Below(i + 1)]);
  }
  for (int64_t i = 0; i < t.numel(); ++i) t.Set(i, 0.01 * (perm[i] - t.numel() / 2));
  return t;
}

// Naive pooling of x [N, C, H, W] in double: max (padded cells never win)
// or average (PyTorch's divisor).
std::vector<double> NaivePool(const PoolCase& t, const Tensor& x, bool max, bool include_pad) {
  const int64_t oh_n = OutSize(t.h, t.kh, t.sh, t.ph), ow_n = OutSize(t.w, t.kw, t.sw, t.pw);
  std::vector<double> y;
  for (int64_t p = 0; p < t.n * t.c; ++p)
    for (int64_t oh = 0; oh < oh_n; ++oh)
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        double best = -std::numeric_limits<double>::infinity(), sum = 0;
        int64_t valid = 0, padded = 0;
        for (int64_t i = 0; i < t.kh; ++i)
          for (int64_t j = 0; j < t.kw; ++j) {
            const int64_t h = oh * t.sh - t.ph + i, w = ow * t.sw - t.pw + j;
            // Cells in the padded frame [-p, H + p) count for count_include_pad.
            if (h < t.h + t.ph && w < t.w + t.pw) ++padded;
            if (h < 0 || h >= t.h || w < 0 || w >= t.w) continue;
            const double v = x.At((p * t.h + h) * t.w + w);
            best = std::max(best, v);
            sum += v;
            ++valid;
          }
        y.push_back(max ? best : sum / (include_pad ? padded : valid));
      }
  return y;
}

using testing::ExpectNear;

std::string CaseName(const PoolCase& t) {
  return StrCat(t.n, "x", t.c, "x", t.h, "x", t.w, " kernel ", t.kh, "x", t.kw, " stride ", t.sh,
                "x", t.sw, " pad ", t.ph, "x", t.pw);
}

TEST(MaxPool2dForward, MatchesNaive) {
  for (const PoolCase& t : Cases()) {
    SCOPED_TRACE(CaseName(t));
    for (DType dtype : {DType::kF64, DType::kF32}) {
      auto layer = MakeLayer("maxpool2d", PoolArgs(t), {InShape(t).WithoutBatch()}, dtype);
      Tensor x = RandomTensor(InShape(t), 3, -1, 1, dtype);
      Tensor y = RunForward(*layer, {x}, OutShape(t), {});
      ExpectNear(NaivePool(t, x, true, false), y, 0, "y");
    }
  }
}

TEST(MaxPool2dForward, PaddingNeverWinsAndNanPropagates) {
  const PoolCase t{1, 1, 4, 4, 3, 3, 2, 2, 1, 1};
  auto layer = MakeLayer("maxpool2d", PoolArgs(t), {InShape(t).WithoutBatch()});
  Tensor x = Tensor::Full(InShape(t), -5.0, DType::kF64);
  Tensor y = RunForward(*layer, {x}, OutShape(t), {});
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(y.At(i), -5.0);  // not the padding's 0

  x.Set(0, std::numeric_limits<double>::quiet_NaN());  // (0, 0): in window (0, 0) only
  y = RunForward(*layer, {x}, OutShape(t), {});
  EXPECT_TRUE(std::isnan(y.At(0)));
  for (int64_t i = 1; i < 4; ++i) EXPECT_EQ(y.At(i), -5.0);
}

// Ties go to the first cell in scan order (PyTorch), so the gradient lands
// there; the gradient of overlapping windows accumulates.
TEST(MaxPool2dBackward, RoutesToFirstMaxAndAccumulates) {
  const PoolCase t{1, 1, 4, 4, 2, 2, 2, 2, 0, 0};
  auto layer = MakeLayer("maxpool2d", PoolArgs(t), {InShape(t).WithoutBatch()});
  Tensor x = Tensor::Full(InShape(t), 1.0, DType::kF64);
  Tensor y = RunForward(*layer, {x}, OutShape(t), {});
  Tensor dy = Tensor::Full(OutShape(t), 2.0, DType::kF64);
  Tensor dx = Tensor::Full(InShape(t), 9.0, DType::kF64);  // must be overwritten
  const Tensor* xp = &x;
  Tensor* dxp = &dx;
  layer->Backward({xp}, y, dy, {dxp});
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t w = 0; w < 4; ++w) {
      EXPECT_EQ(dx.At(h * 4 + w), (h % 2 == 0 && w % 2 == 0) ? 2.0 : 0.0) << h << "," << w;
    }

  // 3x3 stride 1 on a 3x4 ramp: the max of both windows is the cell (2, 2).
  const PoolCase o{1, 1, 3, 4, 3, 3, 1, 1, 0, 0};
  auto overlap = MakeLayer("maxpool2d", PoolArgs(o), {InShape(o).WithoutBatch()});
  Tensor r = Tensor::Empty(InShape(o), DType::kF64);
  for (int64_t i = 0; i < 12; ++i) r.Set(i, i == 10 ? 100.0 : i);
  Tensor ry = RunForward(*overlap, {r}, OutShape(o), {});
  Tensor rdy = Tensor::Full(OutShape(o), 1.5, DType::kF64);
  Tensor rdx = Tensor::Empty(InShape(o), DType::kF64);
  const Tensor* rp = &r;
  Tensor* rdxp = &rdx;
  overlap->Backward({rp}, ry, rdy, {rdxp});
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(rdx.At(i), i == 10 ? 3.0 : 0.0) << i;
}

// Enough planes for several parallel tasks; backward against naive routing.
TEST(MaxPool2dForward, ManyPlanesForwardAndBackwardMatchNaive) {
  const PoolCase t{8, 40, 28, 28, 2, 2, 2, 2, 0, 0};
  auto layer = MakeLayer("maxpool2d", PoolArgs(t), {InShape(t).WithoutBatch()}, DType::kF32);
  Tensor x = RandomTensor(InShape(t), 3, -1, 1, DType::kF32);
  Tensor y = RunForward(*layer, {x}, OutShape(t), {});
  ExpectNear(NaivePool(t, x, true, false), y, 0, "y");

  Tensor dy = RandomTensor(OutShape(t), 4, -1, 1, DType::kF32);
  Tensor dx = Tensor::Full(InShape(t), 7.0, DType::kF32);
  const Tensor* xp = &x;
  Tensor* dxp = &dx;
  layer->Backward({xp}, y, dy, {dxp});
  std::vector<double> want(x.numel(), 0.0);
  const int64_t oh_n = OutShape(t)[2], ow_n = OutShape(t)[3];
  for (int64_t p = 0; p < t.n * t.c; ++p)
    for (int64_t oh = 0; oh < oh_n; ++oh)
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        int64_t arg = -1;
        for (int64_t i = 0; i < t.kh; ++i)
          for (int64_t j = 0; j < t.kw; ++j) {
            const int64_t at = (p * t.h + oh * t.sh + i) * t.w + ow * t.sw + j;
            if (arg < 0 || x.At(at) > x.At(arg)) arg = at;
          }
        want[arg] += dy.At((p * oh_n + oh) * ow_n + ow);
      }
  ExpectNear(want, dx, 0, "dx");
}

// Channels-last (Layer::SetChannelsLast): the NHWC forward and backward
// against the NCHW ones on the same values, with ties (values from a few
// levels, so the scan order decides) and NaNs, for every case's geometry.
TEST(MaxPool2dForward, ChannelsLastMatchesNchw) {
  for (const PoolCase& t : Cases()) {
    SCOPED_TRACE(::testing::Message() << "case " << t.h << "x" << t.w << " kernel " << t.kh << "x"
                                      << t.kw << " stride " << t.sh << " pad " << t.ph);
    for (DType dtype : {DType::kF64, DType::kF32}) {
      auto nchw = MakeLayer("maxpool2d", PoolArgs(t), {InShape(t).WithoutBatch()}, dtype);
      auto nhwc = MakeLayer("maxpool2d", PoolArgs(t), {InShape(t).WithoutBatch()}, dtype);
      nhwc->SetChannelsLast({true}, true);
      Tensor x = RandomTensor(InShape(t), 5, -2, 2, dtype);
      for (int64_t i = 0; i < x.numel(); ++i) x.Set(i, std::round(x.At(i)));
      x.Set(x.numel() / 2, std::numeric_limits<double>::quiet_NaN());
      const Tensor xl = testing::ToChannelsLast(x);
      const Tensor y = RunForward(*nchw, {x}, OutShape(t), {});
      const Tensor yl = testing::FromChannelsLast(RunForward(*nhwc, {xl}, OutShape(t), {}));
      for (int64_t i = 0; i < y.numel(); ++i) {
        ASSERT_TRUE(y.At(i) == yl.At(i) || (std::isnan(y.At(i)) && std::isnan(yl.At(i)))) << i;
      }
      const Tensor dy = RandomTensor(OutShape(t), 6, -1, 1, dtype);
      Tensor dx = Tensor::Full(InShape(t), 7.0, dtype), dxl = Tensor::Full(InShape(t), 7.0, dtype);
      const Tensor dyl = testing::ToChannelsLast(dy);
      nchw->Backward({&x}, y, dy, {&dx});
      nhwc->Backward({&xl}, testing::ToChannelsLast(yl), dyl, {&dxl});
      const Tensor back = testing::FromChannelsLast(dxl);
      for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_EQ(dx.At(i), back.At(i)) << i;
    }
  }
}

// The f32 2x2 path (scalar, AVX2 or AVX-512: each this CPU has) against the
// f64 one (scalar), with ties, NaNs and rows of 1 to 35 outputs (several
// vector steps, ragged tails).
TEST(MaxPool2dForward, Float2x2PathMatchesDoublePathWithTiesAndNans) {
  const cpu::Isa machine = cpu::MaxIsa();
  for (int isa = 0; isa <= static_cast<int>(machine); ++isa)
    for (int64_t w : {2, 6, 14, 16, 18, 28, 32, 34, 70}) {
      cpu::SetMaxIsa(static_cast<cpu::Isa>(isa));
      const PoolCase t{2, 3, 6, w, 2, 2, 2, 2, 0, 0};
      SCOPED_TRACE(StrCat(cpu::IsaName(cpu::MaxIsa()), " ", CaseName(t)));
      Tensor x64 = Tensor::Empty(InShape(t), DType::kF64);
      Rng rng(static_cast<uint64_t>(w));
      for (int64_t i = 0; i < x64.numel(); ++i) {
        const double u = rng.Uniform();
        x64.Set(i, u < 0.05 ? std::numeric_limits<double>::quiet_NaN()
                            : std::floor(u * 4));  // many ties
      }
      Tensor x32 = x64.Cast(DType::kF32);
      Tensor dy64 = RandomTensor(OutShape(t), 5, -1, 1, DType::kF64);
      Tensor dy32 = dy64.Cast(DType::kF32);
      Tensor dx[2];
      Tensor y[2];
      int k = 0;
      for (DType dtype : {DType::kF64, DType::kF32}) {
        auto layer = MakeLayer("maxpool2d", PoolArgs(t), {InShape(t).WithoutBatch()}, dtype);
        const Tensor& x = dtype == DType::kF64 ? x64 : x32;
        y[k] = RunForward(*layer, {x}, OutShape(t), {});
        dx[k] = Tensor::Empty(InShape(t), dtype);
        const Tensor* xp = &x;
        Tensor* dxp = &dx[k];
        layer->Backward({xp}, y[k], dtype == DType::kF64 ? dy64 : dy32, {dxp});
        ++k;
      }
      for (int64_t i = 0; i < y[0].numel(); ++i) {
        if (std::isnan(y[0].At(i))) {
          EXPECT_TRUE(std::isnan(y[1].At(i))) << i;
        } else {
          EXPECT_EQ(y[0].At(i), y[1].At(i)) << i;
        }
      }
      // Same argmax everywhere: the gradient lands on the same cells.
      for (int64_t i = 0; i < dx[0].numel(); ++i) {
        EXPECT_NEAR(dx[0].At(i), dx[1].At(i), 1e-6) << i;
      }
    }
  cpu::SetMaxIsa(machine);
  if (machine == cpu::Isa::kScalar) GTEST_SKIP() << "no AVX2 here: only the scalar path ran";
}

TEST(MaxPool2dGradient, MatchesFiniteDifferences) {
  for (const PoolCase& t : Cases()) {
    SCOPED_TRACE(CaseName(t));
    auto layer = MakeLayer("maxpool2d", PoolArgs(t), {InShape(t).WithoutBatch()});
    CheckGradients(*layer, {DistinctTensor(InShape(t), 7)}, OutShape(t));
  }
}

TEST(MaxPool2dBuild, DefaultsShapesAndErrors) {
  Args a;
  a.Set("kernel", int64_t{2});
  auto layer = MakeLayer("maxpool2d", a, {Shape({32, 28, 28})}, DType::kF32);
  auto* pool = dynamic_cast<MaxPool2d*>(layer.get());
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->geometry().stride_h, 2);  // stride defaults to the kernel
  EXPECT_EQ(pool->geometry().out_h, 14);
  EXPECT_EQ(pool->geometry().out_w, 14);
  EXPECT_TRUE(layer->parameters().empty());

  try {
    MakeLayer("maxpool2d", a, {Shape({3, 1, 5})});
    ADD_FAILURE() << "no ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_EQ(std::string(e.what()),
              "maxpool2d: input [3, 1, 5] padded by 0x0 is smaller than the 2x2 kernel");
  }
  try {
    MakeLayer("maxpool2d", a, {Shape({3, 5})});
    ADD_FAILURE() << "no ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_EQ(std::string(e.what()), "maxpool2d expects one [C, H, W] input, got [3, 5]");
  }
  a.Set("pad", int64_t{2});
  EXPECT_THROW(MakeLayer("maxpool2d", a, {Shape({1, 8, 8})}), ConfigError);
}

class AvgPool2dTest : public ::testing::TestWithParam<bool> {};

TEST_P(AvgPool2dTest, ForwardMatchesNaive) {
  const bool include_pad = GetParam();
  for (const PoolCase& t : Cases()) {
    SCOPED_TRACE(CaseName(t));
    for (DType dtype : {DType::kF64, DType::kF32}) {
      Args a = PoolArgs(t);
      a.Set("count_include_pad", include_pad);
      auto layer = MakeLayer("avgpool2d", a, {InShape(t).WithoutBatch()}, dtype);
      Tensor x = RandomTensor(InShape(t), 4, -1, 1, dtype);
      Tensor y = RunForward(*layer, {x}, OutShape(t), {});
      ExpectNear(NaivePool(t, x, false, include_pad), y, dtype == DType::kF64 ? 1e-14 : 1e-6, "y");
    }
  }
}

TEST_P(AvgPool2dTest, GradientMatchesFiniteDifferences) {
  for (const PoolCase& t : Cases()) {
    SCOPED_TRACE(CaseName(t));
    Args a = PoolArgs(t);
    a.Set("count_include_pad", GetParam());
    auto layer = MakeLayer("avgpool2d", a, {InShape(t).WithoutBatch()});
    CheckGradients(*layer, {RandomTensor(InShape(t), 8)}, OutShape(t));
  }
}

INSTANTIATE_TEST_SUITE_P(AvgPool2d, AvgPool2dTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("IncludePad") : std::string("ExcludePad");
                         });

// The divisor at the corner of a padded 3x3/1 pool: 9 with padding counted,
// 4 valid cells without (values from torch.nn.AvgPool2d).
TEST(AvgPool2dForward, CornerDivisor) {
  const PoolCase t{1, 1, 3, 3, 3, 3, 1, 1, 1, 1};
  for (bool include_pad : {true, false}) {
    Args a = PoolArgs(t);
    a.Set("count_include_pad", include_pad);
    auto layer = MakeLayer("avgpool2d", a, {InShape(t).WithoutBatch()});
    Tensor x = Tensor::Full(InShape(t), 1.0, DType::kF64);
    Tensor y = RunForward(*layer, {x}, OutShape(t), {});
    EXPECT_DOUBLE_EQ(y.At(0), include_pad ? 4.0 / 9.0 : 1.0);
    EXPECT_DOUBLE_EQ(y.At(4), 1.0);
  }
  Args d;
  d.Set("kernel", int64_t{2});
  auto layer = MakeLayer("avgpool2d", d, {Shape({1, 4, 4})});
  auto* pool = dynamic_cast<AvgPool2d*>(layer.get());
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->geometry().stride_w, 2);
}

TEST(GlobalAvgPoolForward, MatchesNaive2dAnd1d) {
  for (const Shape& sample : {Shape({3, 5, 7}), Shape({4, 9}), Shape({2, 1, 1})}) {
    SCOPED_TRACE(sample.ToString());
    for (DType dtype : {DType::kF64, DType::kF32}) {
      auto layer = MakeLayer("global_avgpool", {}, {sample}, dtype);
      EXPECT_EQ(layer->Build({sample}, dtype), Shape({sample[0]}));
      const Shape in = sample.WithBatch(3);
      Tensor x = RandomTensor(in, 5, -1, 1, dtype);
      Tensor y = RunForward(*layer, {x}, {3, sample[0]}, {});
      const int64_t plane = sample.numel() / sample[0];
      for (int64_t r = 0; r < 3 * sample[0]; ++r) {
        double s = 0;
        for (int64_t i = 0; i < plane; ++i) s += x.At(r * plane + i);
        EXPECT_NEAR(y.At(r), s / plane, dtype == DType::kF64 ? 1e-15 : 1e-6) << r;
      }
    }
  }
}

TEST(GlobalAvgPoolGradient, MatchesFiniteDifferences) {
  for (const Shape& sample : {Shape({3, 5, 7}), Shape({4, 9})}) {
    auto layer = MakeLayer("global_avgpool", {}, {sample});
    CheckGradients(*layer, {RandomTensor(sample.WithBatch(2), 9)}, {2, sample[0]});
  }
}

TEST(GlobalAvgPoolBuild, RejectsOtherRanks) {
  for (const Shape& bad : {Shape({5}), Shape({1, 2, 3, 4})}) {
    try {
      MakeLayer("global_avgpool", {}, {bad});
      ADD_FAILURE() << "no ShapeError for " << bad;
    } catch (const ShapeError& e) {
      EXPECT_EQ(std::string(e.what()),
                "global_avgpool expects one [C, H, W] or [C, L] input, got " + bad.ToString());
    }
  }
}

}  // namespace
}  // namespace cnnflow

namespace cnnflow {
namespace {

// By hand (--gtest_also_run_disabled_tests --gtest_filter='*MaxPool2x2Timing*'):
// the 2x2 forward on conv1's output of the Fashion-MNIST model, each ISA.
TEST(MaxPool2dBench, DISABLED_MaxPool2x2Timing) {
  const PoolCase t{64, 32, 28, 28, 2, 2, 2, 2, 0, 0};
  auto layer = MakeLayer("maxpool2d", PoolArgs(t), {InShape(t).WithoutBatch()}, DType::kF32);
  const Tensor x = RandomTensor(InShape(t), 1, -1, 1, DType::kF32);
  Tensor y = Tensor::Empty(OutShape(t), DType::kF32);
  const cpu::Isa machine = cpu::MaxIsa();
  for (int rep = 0; rep < 3; ++rep) {
    for (int isa = 0; isa <= static_cast<int>(machine); ++isa) {
      cpu::SetMaxIsa(static_cast<cpu::Isa>(isa));
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 200; ++i) layer->Forward({&x}, y, {});
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          200;
      std::printf("%-7s forward %.1f us\n", cpu::IsaName(cpu::MaxIsa()), us);
    }
  }
  cpu::SetMaxIsa(machine);
}

}  // namespace
}  // namespace cnnflow
