// An activation fused into the layer before it (Layer::FuseRelu: conv2d on
// both CPU algorithms, batchnorm in training and evaluation, add;
// Layer::FuseGelu: batchnorm) against the same layer followed by the
// activation's own layer: the same output and the same gradients of the
// input and of every parameter. The unfused pair is itself checked against
// naive loops and finite differences in its own tests.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ops/cpu/gelu_vector.h"
#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

using testing::MakeLayer;
using testing::RandomTensor;
using testing::RunForward;

struct Result {
  Tensor y;
  std::vector<Tensor> dx;
  std::vector<Tensor> grads;
};

// Forward and backward of `layer` (fused when `fuse`, else followed by an
// `act` layer: relu or gelu) on inputs xs, with dy the gradient of the
// activation's output.
Result Run(Layer& layer, const std::string& act, bool fuse, const std::vector<Tensor>& xs,
           const Shape& out, const Tensor& dy, const ForwardContext& ctx) {
  if (fuse) {
    EXPECT_TRUE(act == "relu" ? layer.FuseRelu() : layer.FuseGelu());
  }
  std::vector<const Tensor*> in;
  for (const Tensor& x : xs) in.push_back(&x);
  Tensor z = Tensor::Empty(out, xs[0].dtype());
  layer.Forward(in, z, ctx);
  Result r;
  Tensor g = dy;
  if (fuse) {
    r.y = z;
  } else {
    auto activation = MakeLayer(act, {}, {out.WithoutBatch()}, xs[0].dtype());
    r.y = RunForward(*activation, {z}, out, ctx);
    g = Tensor::Empty(out, xs[0].dtype());
    const Tensor* zp = &z;
    Tensor* gp = &g;
    activation->Backward({zp}, r.y, dy, {gp});
  }
  for (auto& p : layer.parameters()) p.grad.Zero();
  std::vector<Tensor*> dxp;
  for (const Tensor& x : xs) r.dx.push_back(Tensor::Full(x.shape(), 7.0, x.dtype()));
  for (Tensor& d : r.dx) dxp.push_back(&d);
  layer.Backward(in, r.y, g, dxp);
  for (auto& p : layer.parameters()) r.grads.push_back(p.grad.Clone());
  return r;
}

void ExpectSame(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  int bad = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::abs(a.At(i) - b.At(i)) > tol * (1 + std::abs(b.At(i))) && bad++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: fused " << a.At(i) << ", unfused " << b.At(i);
    }
  }
}

// Builds the layer twice (same seed: same parameters), runs both ways and
// compares. For a relu, a good share of the outputs must be clipped, or the
// test would not see the mask.
void CheckFusion(const std::string& type, const Args& args, const std::vector<Shape>& samples,
                 int64_t n, DType dtype, double tol, const ForwardContext& ctx = {},
                 const std::string& act = "relu") {
  SCOPED_TRACE(StrCat(type, " + ", act, " ", DTypeName(dtype), ctx.training ? "" : " eval"));
  auto fused = MakeLayer(type, args, samples, dtype, 5);
  auto plain = MakeLayer(type, args, samples, dtype, 5);
  const LayerType* t = LayerRegistry::Get().Find(type);
  Args filled = args;
  filled.FillDefaults(t->schema);
  const Shape out = t->create("shape", filled)->Build(samples, dtype).WithBatch(n);
  std::vector<Tensor> xs;
  for (size_t i = 0; i < samples.size(); ++i) {
    xs.push_back(RandomTensor(samples[i].WithBatch(n), 20 + i, -1, 1, dtype));
  }
  const Tensor dy = RandomTensor(out, 30, -1, 1, dtype);
  const Result a = Run(*fused, act, true, xs, out, dy, ctx);
  const Result b = Run(*plain, act, false, xs, out, dy, ctx);
  if (act == "relu") {
    int64_t clipped = 0;
    for (int64_t i = 0; i < b.y.numel(); ++i) clipped += b.y.At(i) == 0;
    EXPECT_GT(clipped, b.y.numel() / 5) << "too few outputs clipped to test the mask";
    EXPECT_LT(clipped, b.y.numel() * 4 / 5);
  }
  ExpectSame(a.y, b.y, tol, "y");
  for (size_t i = 0; i < a.dx.size(); ++i) ExpectSame(a.dx[i], b.dx[i], tol, StrCat("dx", i));
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ExpectSame(a.grads[i], b.grads[i], tol, StrCat("grad of parameter ", i));
  }
}

Args ConvArgs(const std::string& algo, int64_t stride, bool bias) {
  Args a;
  a.Set("out", int64_t{16});
  a.Set("kernel", int64_t{3});
  a.Set("pad", int64_t{1});
  a.Set("stride", stride);
  a.Set("bias", bias);
  a.Set("algo", algo);
  return a;
}

TEST(FusedRelu, Conv2dGemm) {
  // 9x9 outputs run per-sample GEMMs; 5x5 ones (P < 64) one GEMM per chunk.
  CheckFusion("conv2d", ConvArgs("gemm", 1, true), {Shape({8, 9, 9})}, 19, DType::kF64, 1e-12);
  CheckFusion("conv2d", ConvArgs("gemm", 1, true), {Shape({8, 5, 5})}, 19, DType::kF64, 1e-12);
  CheckFusion("conv2d", ConvArgs("gemm", 2, false), {Shape({8, 9, 9})}, 5, DType::kF32, 1e-5);
}

TEST(FusedRelu, Conv2dOnednn) {
  CheckFusion("conv2d", ConvArgs("onednn", 1, true), {Shape({8, 9, 9})}, 19, DType::kF32, 1e-5);
  CheckFusion("conv2d", ConvArgs("onednn", 2, false), {Shape({16, 8, 8})}, 5, DType::kF32, 1e-5);
}

TEST(FusedRelu, BatchNormTrainingAndEvaluation) {
  ForwardContext eval;
  eval.training = false;
  for (DType dtype : {DType::kF64, DType::kF32}) {
    const double tol = dtype == DType::kF64 ? 1e-12 : 1e-5;
    CheckFusion("batchnorm", {}, {Shape({6, 5, 7})}, 9, dtype, tol);
    CheckFusion("batchnorm", {}, {Shape({6, 40})}, 9, dtype, tol, eval);
  }
}

// f32: the fused GELU's erf (Abramowitz-Stegun, as PyTorch's vectorised
// one) against oneDNN's in the gelu layer. 7x7 planes run whole 16-lane
// vectors and a tail; [6, 40] rows of 40 two and a tail.
TEST(FusedGelu, BatchNormTrainingAndEvaluation) {
  ForwardContext eval;
  eval.training = false;
  for (DType dtype : {DType::kF64, DType::kF32}) {
    const double tol = dtype == DType::kF64 ? 1e-12 : 2e-5;
    CheckFusion("batchnorm", {}, {Shape({6, 7, 7})}, 9, dtype, tol, {}, "gelu");
    CheckFusion("batchnorm", {}, {Shape({6, 40})}, 9, dtype, tol, eval, "gelu");
  }
}

// The vectorised erf GELU and its gradient against the f64 formula, over
// [-12, 12] (past where exp(-u^2 / 2) underflows f32) at 1/64 steps, as
// one row with a tail.
TEST(FusedGelu, VectorGeluMatchesTheF64Formula) {
  std::vector<float> u, g;
  for (int i = -12 * 64; i <= 12 * 64; ++i) u.push_back(static_cast<float>(i) / 64);
  for (size_t i = 0; i < u.size(); ++i) g.push_back(0.5f + static_cast<float>(i % 7) / 7);
  std::vector<float> y = u, du(u.size());
  cpu::GeluErfInPlace(y.data(), static_cast<int64_t>(y.size()));
  cpu::GeluErfGrad(u.data(), g.data(), du.data(), static_cast<int64_t>(u.size()));
  for (size_t i = 0; i < u.size(); ++i) {
    const double v = u[i];
    const double cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
    const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
    ASSERT_NEAR(y[i], v * cdf, 3e-7 * (1 + std::abs(v))) << "gelu(" << v << ")";
    ASSERT_NEAR(du[i], g[i] * (cdf + v * pdf), 1e-6) << "gelu'(" << v << ")";
  }
}

TEST(FusedRelu, ResidualAdd) {
  for (DType dtype : {DType::kF64, DType::kF32}) {
    CheckFusion("add", {}, {Shape({4, 6, 6}), Shape({4, 6, 6})}, 3, dtype, 1e-12);
  }
}

// conv1d keeps its ReLU as a layer (its shifted GEMMs have no epilogue);
// only batchnorm takes a GELU.
TEST(FusedRelu, Conv1dDeclines) {
  Args a;
  a.Set("out", int64_t{4});
  a.Set("kernel", int64_t{3});
  auto layer = MakeLayer("conv1d", a, {Shape({8, 20})});
  EXPECT_FALSE(layer->FuseRelu());
  EXPECT_FALSE(layer->FuseGelu());
  EXPECT_FALSE(MakeLayer("conv2d", ConvArgs("gemm", 1, true), {Shape({8, 9, 9})})->FuseGelu());
}

}  // namespace
}  // namespace cnnflow
