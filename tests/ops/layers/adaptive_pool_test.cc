// adaptive_avgpool2d / adaptive_avgpool1d against a direct f64 bin loop
// (torch.nn.AdaptiveAvgPool's bins [floor(i*H/h), ceil((i+1)*H/h)) computed
// in floating point here), and their errors. The layer table
// (tests/ops/layers/layer_table.cc) checks the gradients and f32 against f64.
#include "ops/layers/adaptive_pool.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

using testing::MakeLayer;
using testing::RandomTensor;
using testing::RunForward;

int64_t Lo(int64_t i, int64_t in, int64_t out) {
  return static_cast<int64_t>(std::floor(static_cast<double>(i) * in / out));
}
int64_t Hi(int64_t i, int64_t in, int64_t out) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(i + 1) * in / out));
}

struct Case {
  Shape x;         // [N, C, H, W] or [N, C, L]
  int64_t oh, ow;  // oh = 1 for 1D
};

Args OutArgs(const Case& c) {
  Args a;
  if (c.x.rank() == 4) {
    a.Set("out", std::vector<int64_t>{c.oh, c.ow});
  } else {
    a.Set("out", c.ow);
  }
  return a;
}

// Naive f64 forward and backward (dy -> dx by scattering over each bin).
void Reference(const Case& c, const Tensor& x, const Tensor& dy, Tensor& y, Tensor& dx) {
  const bool two = c.x.rank() == 4;
  const int64_t planes = c.x[0] * c.x[1], H = two ? c.x[2] : 1, W = c.x[c.x.rank() - 1];
  for (int64_t i = 0; i < dx.numel(); ++i) dx.Set(i, 0);
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t oh = 0; oh < c.oh; ++oh) {
      for (int64_t ow = 0; ow < c.ow; ++ow) {
        const int64_t hs = Lo(oh, H, c.oh), he = Hi(oh, H, c.oh);
        const int64_t ws = Lo(ow, W, c.ow), we = Hi(ow, W, c.ow);
        const double count = static_cast<double>((he - hs) * (we - ws));
        double s = 0;
        for (int64_t h = hs; h < he; ++h)
          for (int64_t w = ws; w < we; ++w) s += x.At((p * H + h) * W + w);
        const int64_t o = (p * c.oh + oh) * c.ow + ow;
        y.Set(o, s / count);
        for (int64_t h = hs; h < he; ++h)
          for (int64_t w = ws; w < we; ++w) {
            const int64_t i = (p * H + h) * W + w;
            dx.Set(i, dx.At(i) + dy.At(o) / count);
          }
      }
    }
  }
}

Shape OutShape(const Case& c) {
  if (c.x.rank() == 4) return {c.x[0], c.x[1], c.oh, c.ow};
  return {c.x[0], c.x[1], c.ow};
}

const Case kCases[] = {
    {{2, 3, 7, 5}, 3, 2},                             // overlapping bins
    {{1, 2, 8, 6}, 4, 3},                             // divisible: plain average pooling
    {{1, 2, 3, 5}, 5, 7},                             // more outputs than inputs
    {{2, 3, 6, 6}, 1, 1},                             // global
    {{3, 2, 224 / 16, 9}, 7, 7}, {{2, 3, 10}, 1, 4},  // 1D
    {{1, 2, 5}, 1, 8},                                // 1D, upsampling
};

TEST(AdaptiveAvgPool, ForwardAndBackwardMatchNaiveBins) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.x.ToString() + " -> " + OutShape(c).ToString());
    const Shape out = OutShape(c);
    Tensor x64 = RandomTensor(c.x, 3), dy64 = RandomTensor(out, 4);
    Tensor y_ref = Tensor::Empty(out, DType::kF64), dx_ref = Tensor::Empty(c.x, DType::kF64);
    Reference(c, x64, dy64, y_ref, dx_ref);
    auto layer = MakeLayer(c.x.rank() == 4 ? "adaptive_avgpool2d" : "adaptive_avgpool1d",
                           OutArgs(c), {c.x.WithoutBatch()});
    Tensor y = RunForward(*layer, {x64}, out, {});
    for (int64_t i = 0; i < y.numel(); ++i) ASSERT_NEAR(y.At(i), y_ref.At(i), 1e-12) << i;
    Tensor dx = Tensor::Full(c.x, 7.0, DType::kF64);  // overwritten
    layer->Backward({&x64}, y, dy64, {&dx});
    for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_NEAR(dx.At(i), dx_ref.At(i), 1e-12) << i;
  }
}

TEST(AdaptiveAvgPool, ScalarOutAndErrors) {
  Args a;
  a.Set("out", int64_t{3});
  auto layer = MakeLayer("adaptive_avgpool2d", a, {Shape{2, 9, 6}});
  EXPECT_EQ(layer->Build({Shape{2, 9, 6}}, DType::kF64), (Shape{2, 3, 3}));
  EXPECT_THROW(layer->Build({Shape{2, 9}}, DType::kF64), ShapeError);
  Args zero;
  zero.Set("out", int64_t{0});
  EXPECT_THROW(MakeLayer("adaptive_avgpool1d", zero, {Shape{2, 9}}), ConfigError);
  Args one;
  one.Set("out", int64_t{2});
  EXPECT_THROW(MakeLayer("adaptive_avgpool1d", one, {Shape{2, 3, 9}}), ShapeError);
}

}  // namespace
}  // namespace cnnflow
