// A ReLU fused into the layer before it (Layer::FuseRelu: conv2d on both
// CPU algorithms, batchnorm in training and evaluation, add) against the
// same layer followed by a relu layer: the same output and the same
// gradients of the input and of every parameter. The unfused pair is itself
// checked against naive loops and finite differences in its own tests.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

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

// Forward and backward of `layer` (fused when `fuse`, else followed by a
// relu layer) on inputs xs, with dy the gradient of the ReLU's output.
Result Run(Layer& layer, bool fuse, const std::vector<Tensor>& xs, const Shape& out,
           const Tensor& dy, const ForwardContext& ctx) {
  if (fuse) EXPECT_TRUE(layer.FuseRelu());
  std::vector<const Tensor*> in;
  for (const Tensor& x : xs) in.push_back(&x);
  Tensor z = Tensor::Empty(out, xs[0].dtype());
  layer.Forward(in, z, ctx);
  Result r;
  Tensor g = dy;
  if (fuse) {
    r.y = z;
  } else {
    auto relu = MakeLayer("relu", {}, {out.WithoutBatch()}, xs[0].dtype());
    r.y = RunForward(*relu, {z}, out, ctx);
    g = Tensor::Empty(out, xs[0].dtype());
    const Tensor* zp = &z;
    Tensor* gp = &g;
    relu->Backward({zp}, r.y, dy, {gp});
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
// compares. A good share of the outputs must be clipped, or the test
// would not see the mask.
void CheckFusion(const std::string& type, const Args& args, const std::vector<Shape>& samples,
                 int64_t n, DType dtype, double tol, const ForwardContext& ctx = {}) {
  SCOPED_TRACE(StrCat(type, " ", DTypeName(dtype), ctx.training ? "" : " eval"));
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
  const Result a = Run(*fused, true, xs, out, dy, ctx);
  const Result b = Run(*plain, false, xs, out, dy, ctx);
  int64_t clipped = 0;
  for (int64_t i = 0; i < b.y.numel(); ++i) clipped += b.y.At(i) == 0;
  EXPECT_GT(clipped, b.y.numel() / 5) << "too few outputs clipped to test the mask";
  EXPECT_LT(clipped, b.y.numel() * 4 / 5);
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

TEST(FusedRelu, ResidualAdd) {
  for (DType dtype : {DType::kF64, DType::kF32}) {
    CheckFusion("add", {}, {Shape({4, 6, 6}), Shape({4, 6, 6})}, 3, dtype, 1e-12);
  }
}

// conv1d keeps its ReLU as a layer (its shifted GEMMs have no epilogue).
TEST(FusedRelu, Conv1dDeclines) {
  Args a;
  a.Set("out", int64_t{4});
  a.Set("kernel", int64_t{3});
  auto layer = MakeLayer("conv1d", a, {Shape({8, 20})});
  EXPECT_FALSE(layer->FuseRelu());
}

}  // namespace
}  // namespace cnnflow
