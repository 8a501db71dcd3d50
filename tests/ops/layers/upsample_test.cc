// upsample against direct f64 formulas of torch.nn.Upsample (nearest:
// src = floor(dst / scale), or floor(dst * in/out) for a size; bilinear with
// align_corners false / true), forward and backward (the adjoint, by
// scattering each output's taps), and its errors. The layer table
// (tests/ops/layers/layer_table.cc) checks the gradients and f32 against f64.
#include "ops/layers/upsample.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

using testing::MakeLayer;
using testing::RandomTensor;
using testing::RunForward;

struct Case {
  Shape x;                    // [N, C, H, W]
  std::vector<double> scale;  // empty: size
  std::vector<int64_t> size;
  bool bilinear;
  bool align_corners;
};

Args CaseArgs(const Case& c) {
  Args a;
  if (!c.scale.empty()) a.Set("scale", c.scale);
  if (!c.size.empty()) a.Set("size", c.size);
  a.Set("mode", std::string(c.bilinear ? "bilinear" : "nearest"));
  a.Set("align_corners", c.align_corners);
  return a;
}

Shape OutShape(const Case& c) {
  if (!c.size.empty()) return {c.x[0], c.x[1], c.size[0], c.size.back()};
  return {c.x[0], c.x[1], static_cast<int64_t>(std::floor(c.x[2] * c.scale[0])),
          static_cast<int64_t>(std::floor(c.x[3] * c.scale.back()))};
}

// Taps of output o along an axis: (index, weight) x 2.
struct Taps {
  int64_t i0, i1;
  double w0, w1;
};
Taps AxisTaps(const Case& c, int64_t o, int64_t in, int64_t out, double scale) {
  if (!c.bilinear) {
    const double src = scale > 0 ? o / scale : static_cast<double>(o) * in / out;
    const int64_t i = std::min<int64_t>(static_cast<int64_t>(std::floor(src)), in - 1);
    return {i, i, 1, 0};
  }
  double src;
  if (c.align_corners) {
    src = out > 1 ? static_cast<double>(o) * (in - 1) / (out - 1) : 0;
  } else {
    src = scale > 0 ? (o + 0.5) / scale - 0.5 : (o + 0.5) * in / out - 0.5;
    src = std::max(src, 0.0);
  }
  const int64_t i0 = std::min<int64_t>(static_cast<int64_t>(std::floor(src)), in - 1);
  const int64_t i1 = std::min<int64_t>(i0 + 1, in - 1);
  const double l = src - i0;
  return {i0, i1, 1 - l, l};
}

void Reference(const Case& c, const Tensor& x, const Tensor& dy, Tensor& y, Tensor& dx) {
  const Shape out = OutShape(c);
  const int64_t planes = c.x[0] * c.x[1], H = c.x[2], W = c.x[3], OH = out[2], OW = out[3];
  const double sh = c.scale.empty() ? 0 : c.scale[0], sw = c.scale.empty() ? 0 : c.scale.back();
  for (int64_t i = 0; i < dx.numel(); ++i) dx.Set(i, 0);
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t oh = 0; oh < OH; ++oh) {
      const Taps th = AxisTaps(c, oh, H, OH, sh);
      for (int64_t ow = 0; ow < OW; ++ow) {
        const Taps tw = AxisTaps(c, ow, W, OW, sw);
        const int64_t hs[2] = {th.i0, th.i1}, ws[2] = {tw.i0, tw.i1};
        const double whs[2] = {th.w0, th.w1}, wws[2] = {tw.w0, tw.w1};
        const int64_t o = (p * OH + oh) * OW + ow;
        double s = 0;
        for (int a = 0; a < 2; ++a)
          for (int b = 0; b < 2; ++b) {
            const int64_t i = (p * H + hs[a]) * W + ws[b];
            s += whs[a] * wws[b] * x.At(i);
            dx.Set(i, dx.At(i) + whs[a] * wws[b] * dy.At(o));
          }
        y.Set(o, s);
      }
    }
  }
}

const Case kCases[] = {
    {{2, 3, 4, 5}, {2}, {}, false, false},        // nearest x2
    {{1, 2, 3, 4}, {3, 2}, {}, false, false},     // nearest, per-axis integer scale
    {{1, 2, 4, 6}, {1.5}, {}, false, false},      // nearest, float scale
    {{1, 2, 5, 4}, {}, {7, 3}, false, false},     // nearest, size (down in W)
    {{2, 3, 4, 5}, {2}, {}, true, false},         // bilinear x2
    {{1, 2, 5, 3}, {2.5, 1.5}, {}, true, false},  // bilinear, float scales
    {{2, 2, 4, 5}, {2}, {}, true, true},          // bilinear, align_corners
    {{1, 2, 6, 7}, {}, {4, 11}, true, false},     // bilinear, size (down in H)
    {{1, 2, 6, 7}, {}, {1, 9}, true, true},       // align_corners with one output row
};

TEST(Upsample, ForwardAndBackwardMatchDirectFormulas) {
  for (const Case& c : kCases) {
    const Shape out = OutShape(c);
    SCOPED_TRACE(c.x.ToString() + " -> " + out.ToString() +
                 (c.bilinear ? " bilinear" : " nearest") + (c.align_corners ? " align" : ""));
    Tensor x64 = RandomTensor(c.x, 3), dy64 = RandomTensor(out, 4);
    Tensor y_ref = Tensor::Empty(out, DType::kF64), dx_ref = Tensor::Empty(c.x, DType::kF64);
    Reference(c, x64, dy64, y_ref, dx_ref);
    auto layer = MakeLayer("upsample", CaseArgs(c), {c.x.WithoutBatch()});
    ASSERT_EQ(layer->Build({c.x.WithoutBatch()}, DType::kF64), out.WithoutBatch());
    Tensor y = RunForward(*layer, {x64}, out, {});
    for (int64_t i = 0; i < y.numel(); ++i) ASSERT_NEAR(y.At(i), y_ref.At(i), 1e-12) << i;
    Tensor dx = Tensor::Full(c.x, 7.0, DType::kF64);  // overwritten
    layer->Backward({&x64}, y, dy64, {&dx});
    for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_NEAR(dx.At(i), dx_ref.At(i), 1e-12) << i;
  }
}

TEST(Upsample, NearestBackwardOfIntegerScaleSumsBlocks) {
  // Scale 2 x 3: each input cell's gradient is the sum of its 2 x 3 block.
  Case c{{1, 1, 2, 2}, {2, 3}, {}, false, false};
  auto layer = MakeLayer("upsample", CaseArgs(c), {c.x.WithoutBatch()});
  Tensor x = RandomTensor(c.x, 1);
  Tensor dy = Tensor::Full({1, 1, 4, 6}, 1.0, DType::kF64);
  Tensor y = RunForward(*layer, {x}, {1, 1, 4, 6}, {});
  Tensor dx = Tensor::Empty(c.x, DType::kF64);
  layer->Backward({&x}, y, dy, {&dx});
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(dx.At(i), 6.0);
}

TEST(Upsample, BadParameters) {
  auto make = [](Args a) { return MakeLayer("upsample", a, {Shape{1, 4, 4}}); };
  Args none;
  EXPECT_THROW(make(none), ConfigError);
  Args both;
  both.Set("scale", 2.0);
  both.Set("size", std::vector<int64_t>{8, 8});
  EXPECT_THROW(make(both), ConfigError);
  Args align;
  align.Set("scale", 2.0);
  align.Set("align_corners", true);
  EXPECT_THROW(make(align), ConfigError);  // nearest
  Args tiny;
  tiny.Set("scale", 0.1);
  EXPECT_THROW(make(tiny), ShapeError);  // floor(4 * 0.1) = 0
}

}  // namespace
}  // namespace cnnflow
