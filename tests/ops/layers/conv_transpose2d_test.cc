// conv_transpose2d against a direct f64 scatter loop (the definition of
// torch.nn.ConvTranspose2d: input cell (h, w) adds x * W[c, k, i, j] into
// output (h*stride - pad + i*dilation, w*stride - pad + j*dilation)), its
// backward against the same loop's adjoint, f32 kernels (GEMM and oneDNN
// paths each) against it, init and errors. The layer table
// (tests/ops/layers/layer_table.cc) checks the gradients.
#include "ops/layers/conv_transpose2d.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

using testing::MakeLayer;
using testing::RandomTensor;
using testing::RunForward;

struct Case {
  int64_t n, c, h, w, k;
  std::vector<int64_t> kernel, stride, pad, output_pad, dilation;
  int64_t groups;
  bool bias;
};

Args CaseArgs(const Case& c, const std::string& algo = "auto") {
  Args a;
  a.Set("out", c.k);
  a.Set("kernel", c.kernel);
  a.Set("stride", c.stride);
  a.Set("pad", c.pad);
  a.Set("output_pad", c.output_pad);
  a.Set("dilation", c.dilation);
  a.Set("groups", c.groups);
  a.Set("bias", c.bias);
  a.Set("algo", algo);
  return a;
}

int64_t V(const std::vector<int64_t>& v, int axis) { return v.size() == 1 ? v[0] : v[axis]; }

Shape OutShape(const Case& c) {
  auto size = [&](int64_t in, int a) {
    return (in - 1) * V(c.stride, a) - 2 * V(c.pad, a) + V(c.dilation, a) * (V(c.kernel, a) - 1) +
           V(c.output_pad, a) + 1;
  };
  return {c.n, c.k, size(c.h, 0), size(c.w, 1)};
}

// The scatter loop, forward and its adjoint at once: y (overwritten),
// dx (overwritten), dw, db (overwritten) from x, w, b, dy.
void Reference(const Case& c, const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& dy,
               Tensor& y, Tensor& dx, Tensor& dw, Tensor& db) {
  const Shape out = OutShape(c);
  const int64_t OH = out[2], OW = out[3], kh = V(c.kernel, 0), kw = V(c.kernel, 1);
  const int64_t cg = c.c / c.groups, kg = c.k / c.groups;
  for (int64_t i = 0; i < y.numel(); ++i) y.Set(i, b ? b->At(i / (OH * OW) % c.k) : 0.0);
  for (Tensor* t : {&dx, &dw, &db}) {
    for (int64_t i = 0; i < t->numel(); ++i) t->Set(i, 0);
  }
  for (int64_t i = 0; i < dy.numel(); ++i) {
    if (b) db.Set(i / (OH * OW) % c.k, db.At(i / (OH * OW) % c.k) + dy.At(i));
  }
  for (int64_t n = 0; n < c.n; ++n)
    for (int64_t ch = 0; ch < c.c; ++ch)
      for (int64_t h = 0; h < c.h; ++h)
        for (int64_t ww = 0; ww < c.w; ++ww) {
          const int64_t xi = ((n * c.c + ch) * c.h + h) * c.w + ww;
          for (int64_t kk = 0; kk < kg; ++kk) {
            const int64_t k = ch / cg * kg + kk;
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t oh = h * V(c.stride, 0) - V(c.pad, 0) + i * V(c.dilation, 0);
                const int64_t ow = ww * V(c.stride, 1) - V(c.pad, 1) + j * V(c.dilation, 1);
                if (oh < 0 || oh >= OH || ow < 0 || ow >= OW) continue;
                const int64_t yi = ((n * c.k + k) * OH + oh) * OW + ow;
                const int64_t wi = ((ch * kg + kk) * kh + i) * kw + j;
                y.Set(yi, y.At(yi) + x.At(xi) * w.At(wi));
                dx.Set(xi, dx.At(xi) + dy.At(yi) * w.At(wi));
                dw.Set(wi, dw.At(wi) + dy.At(yi) * x.At(xi));
              }
          }
        }
}

const Case kCases[] = {
    {2, 4, 3, 4, 6, {3}, {2}, {1}, {1}, {1}, 2, true},         // grouped, output_pad
    {2, 3, 4, 3, 2, {2, 3}, {1, 2}, {0}, {0}, {2}, 1, false},  // dilated, no bias
    {3, 2, 4, 4, 4, {4}, {2}, {1}, {0}, {1}, 1, true},         // DCGAN-style x2
    {1, 2, 3, 3, 3, {3}, {1}, {1}, {1}, {2}, 1, true},         // output_pad >= stride (< dilation)
    {2, 5, 2, 3, 3, {1}, {1}, {0}, {0}, {1}, 1, true},         // pointwise
    {2, 3, 5, 5, 4, {3}, {3}, {2}, {2, 1}, {1}, 1, true},      // stride 3, asymmetric output_pad
};

TEST(ConvTranspose2d, MatchesScatterLoop) {
  for (const Case& c : kCases) {
    const Shape in{c.n, c.c, c.h, c.w}, out = OutShape(c);
    SCOPED_TRACE(in.ToString() + " -> " + out.ToString());
    auto ref_layer = MakeLayer("conv_transpose2d", CaseArgs(c, "gemm"), {in.WithoutBatch()});
    ASSERT_EQ(MakeLayer("conv_transpose2d", CaseArgs(c), {in.WithoutBatch()})
                  ->Build({in.WithoutBatch()}, DType::kF64),
              out.WithoutBatch());
    Tensor x64 = RandomTensor(in, 3), dy64 = RandomTensor(out, 4);
    const Tensor w64 = ref_layer->parameters()[0].value.Clone();
    const Tensor b64 = c.bias ? ref_layer->parameters()[1].value.Clone() : Tensor();
    Tensor y_ref = Tensor::Empty(out, DType::kF64), dx_ref = Tensor::Empty(in, DType::kF64);
    Tensor dw_ref = Tensor::Empty(w64.shape(), DType::kF64),
           db_ref = Tensor::Zeros({c.k}, DType::kF64);
    Reference(c, x64, w64, c.bias ? &b64 : nullptr, dy64, y_ref, dx_ref, dw_ref, db_ref);
    for (DType dt : {DType::kF64, DType::kF32}) {
      for (const char* algo : {"gemm", "onednn", "auto"}) {
        if (dt == DType::kF64 && std::string(algo) != "gemm") continue;
        SCOPED_TRACE(std::string(DTypeName(dt)) + " " + algo);
        const double tol = dt == DType::kF64 ? 1e-12 : 2e-5;
        auto layer = MakeLayer("conv_transpose2d", CaseArgs(c, algo), {in.WithoutBatch()}, dt);
        layer->parameters()[0].value.CopyFrom(w64.Cast(dt));
        if (c.bias) layer->parameters()[1].value.CopyFrom(b64.Cast(dt));
        for (auto& p : layer->parameters()) p.grad.Zero();
        Tensor x = x64.Cast(dt), dy = dy64.Cast(dt);
        Tensor y = RunForward(*layer, {x}, out, {});
        for (int64_t i = 0; i < y.numel(); ++i) ASSERT_NEAR(y.At(i), y_ref.At(i), tol) << i;
        Tensor dx = Tensor::Full(in, 7.0, dt);  // overwritten
        layer->Backward({&x}, y, dy, {&dx});
        for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_NEAR(dx.At(i), dx_ref.At(i), tol) << i;
        const Tensor& dw = layer->parameters()[0].grad;
        for (int64_t i = 0; i < dw.numel(); ++i) ASSERT_NEAR(dw.At(i), dw_ref.At(i), tol) << i;
        if (c.bias) {
          const Tensor& db = layer->parameters()[1].grad;
          for (int64_t i = 0; i < c.k; ++i) ASSERT_NEAR(db.At(i), db_ref.At(i), tol) << i;
        }
      }
    }
  }
}

TEST(ConvTranspose2d, GradientsAccumulate) {
  const Case& c = kCases[0];
  const Shape in{c.n, c.c, c.h, c.w}, out = OutShape(c);
  auto layer = MakeLayer("conv_transpose2d", CaseArgs(c), {in.WithoutBatch()});
  Tensor x = RandomTensor(in, 1), dy = RandomTensor(out, 2);
  for (auto& p : layer->parameters()) p.grad.Zero();
  Tensor y = RunForward(*layer, {x}, out, {});
  layer->Backward({&x}, y, dy, {nullptr});
  const Tensor once = layer->parameters()[0].grad.Clone();
  layer->Backward({&x}, y, dy, {nullptr});
  for (int64_t i = 0; i < once.numel(); ++i) {
    ASSERT_NEAR(layer->parameters()[0].grad.At(i), 2 * once.At(i), 1e-12);
  }
}

TEST(ConvTranspose2d, InitAsPyTorch) {
  // fan_in = weight.size(1) * kh * kw = (K / groups) * 9 = 16 * 9.
  Case c{1, 8, 4, 4, 32, {3}, {1}, {0}, {0}, {1}, 2, true};
  auto layer = MakeLayer("conv_transpose2d", CaseArgs(c), {Shape{8, 4, 4}});
  const double bound = 1.0 / std::sqrt(16.0 * 9.0);
  EXPECT_EQ(layer->parameters()[0].value.shape(), (Shape{8, 16, 3, 3}));
  EXPECT_EQ(layer->parameters()[1].value.shape(), (Shape{32}));
  for (const Parameter& p : layer->parameters()) {
    double m = 0;
    for (int64_t i = 0; i < p.value.numel(); ++i) m = std::max(m, std::abs(p.value.At(i)));
    EXPECT_LE(m, bound);
    EXPECT_GT(m, 0.8 * bound);
  }
}

TEST(ConvTranspose2d, Errors) {
  Case c{1, 4, 4, 4, 4, {3}, {2}, {0}, {2}, {1}, 1, true};  // output_pad 2 >= stride, dilation
  EXPECT_THROW(MakeLayer("conv_transpose2d", CaseArgs(c), {Shape{4, 4, 4}}), ConfigError);
  Case g{1, 3, 4, 4, 4, {3}, {1}, {0}, {0}, {1}, 2, true};  // 3 channels, 2 groups
  EXPECT_THROW(MakeLayer("conv_transpose2d", CaseArgs(g), {Shape{3, 4, 4}}), ShapeError);
  Case p{1, 2, 1, 1, 2, {1}, {1}, {1}, {0}, {1}, 1, true};  // output 1 - 2 = -1 rows
  EXPECT_THROW(MakeLayer("conv_transpose2d", CaseArgs(p), {Shape{2, 1, 1}}), ShapeError);
}

}  // namespace
}  // namespace cnnflow
