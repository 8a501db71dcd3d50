// The own CUDA layers against the CPU (gpu_check.h's CompareWithCpu): relu,
// add, flatten, dropout, linear and the activations, in f32 and in f16/bf16
// mixed precision.
// GPU tests skip without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfenv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ops/cuda/batch_stager.h"
#include "ops/cuda/kernels.h"
#include "ops/layers/dropout.h"
#include "ops/loss.h"
#include "ops/train/optimizer.h"
#include "tests/ops/cuda/util.h"
#include "tests/ops/gpu_check.h"
#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

using namespace ::cnnflow::testing;  // tests/ops/cuda/util.h, gpu_check.h

// ---------------------------------------------------------------- layers

TEST(ReluGPU, MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const auto c = CompareWithCpu({Spec("relu1", "relu")}, Shape{3, 5, 7}, 6);
  EXPECT_LE(c.output, 1e-6) << Describe(c);
  EXPECT_LE(c.input_grad, 1e-6) << Describe(c);
}

TEST(ReluGPU, OddSizeTakesTheScalarTail) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // 3 * 7 = 21 elements per sample: not a multiple of 4.
  const auto c = CompareWithCpu({Spec("relu1", "relu")}, Shape{3, 7}, 5);
  EXPECT_LE(c.output, 1e-6) << Describe(c);
  EXPECT_LE(c.input_grad, 1e-6) << Describe(c);
}

TEST(AddGPU, ResidualModelMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // fc1's output feeds relu1 and the add: its gradient is the sum of two
  // (Model::Backward's fan-out, through cuda::Axpy).
  const auto c = CompareWithCpu(
      {Spec("fc1", "linear", {{"out", int64_t{9}}}), Spec("relu1", "relu"),
       Spec("fc2", "linear", {{"out", int64_t{9}}}), Spec("sum", "add", {}, {"fc2", "fc1"}),
       Spec("fc3", "linear", {{"out", int64_t{4}}})},
      Shape{11}, 6);
  EXPECT_LE(c.output, 1e-4) << Describe(c);
  EXPECT_LE(c.input_grad, 1e-4) << Describe(c);
  EXPECT_LE(c.param_grad, 1e-4) << Describe(c);
}

TEST(AddGPU, BothInputsFromTheModelInput) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // dx = dy + dy: both gradients of the add land on the input.
  const auto c = CompareWithCpu({Spec("twice", "add", {}, {"input", "input"})}, Shape{2, 9}, 3);
  EXPECT_LE(c.output, 1e-6) << Describe(c);
  EXPECT_LE(c.input_grad, 1e-6) << Describe(c);
}

TEST(FlattenGPU, MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const auto c = CompareWithCpu(
      {Spec("flat", "flatten"), Spec("fc", "linear", {{"out", int64_t{5}}})}, Shape{2, 3, 4}, 5);
  EXPECT_LE(c.output, 1e-4) << Describe(c);
  EXPECT_LE(c.input_grad, 1e-4) << Describe(c);
  EXPECT_LE(c.param_grad, 1e-4) << Describe(c);
  const auto alone = CompareWithCpu({Spec("flat", "flatten")}, Shape{3, 2, 5}, 4);
  EXPECT_EQ(alone.output, 0) << Describe(alone);
  EXPECT_EQ(alone.input_grad, 0) << Describe(alone);
}

TEST(DropoutGPU, TrainingMaskEqualsCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // The same mask bit for bit: the outputs and gradients are products of the
  // same floats, so they match exactly.
  const auto c = CompareWithCpu({Spec("drop", "dropout", {{"p", 0.3}})}, Shape{4, 9}, 7, true);
  EXPECT_EQ(c.output, 0) << Describe(c);
  EXPECT_EQ(c.input_grad, 0) << Describe(c);
}

TEST(DropoutGPU, EvaluationIsTheIdentity) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const auto c = CompareWithCpu({Spec("drop", "dropout", {{"p", 0.5}})}, Shape{13}, 3, false);
  EXPECT_EQ(c.output, 0) << Describe(c);
  EXPECT_EQ(c.input_grad, 0) << Describe(c);
}

// One dropout layer of each class, built as a model would build them.
struct DropoutPair {
  std::unique_ptr<Layer> cpu, gpu;
};

DropoutPair MakeDropoutPair(double p, const Shape& sample) {
  const LayerType* t = LayerRegistry::Get().Find("dropout");
  const LayerType* cuda = LayerRegistry::Get().Find("dropout", kCudaVariant);
  if (t == nullptr || cuda == nullptr) throw Error("dropout has no CUDA class registered");
  Args args;
  args.Set("p", p);
  args.FillDefaults(t->schema);
  DropoutPair d{t->create("drop", args), cuda->create("drop", args)};
  d.cpu->Build({sample}, DType::kF32);
  d.gpu->Build({sample}, DType::kF32);
  d.gpu->MoveTo(kGpu);
  return d;
}

TEST(DropoutGPU, SampleIdsGiveTheCpuMask) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // 300 rows: more than one launch's table of ids; ids far apart, large and
  // repeated, so a mask keyed by the row number would differ.
  const Shape sample{37};
  const int64_t rows = 300;
  std::vector<int64_t> ids(rows);
  for (int64_t r = 0; r < rows; ++r)
    ids[r] = (r * 7919 + 13) % 1000003 + (r % 5 == 0 ? 50000000 : 0);
  ids[7] = ids[3];
  for (const double p : {0.1, 0.5, 0.9}) {
    DropoutPair d = MakeDropoutPair(p, sample);
    const Tensor x = RandomTensor(sample.WithBatch(rows), 21, -1, 1, DType::kF32);
    ForwardContext ctx;
    ctx.seed = 99;
    ctx.step = 12;
    ctx.sample_ids = ids.data();
    Tensor y_cpu = Tensor::Empty(x.shape());
    d.cpu->Forward({&x}, y_cpu, ctx);
    const Tensor xg = x.To(kGpu);
    Tensor y_gpu = Tensor::Empty(x.shape(), DType::kF32, kGpu);
    d.gpu->Forward({&xg}, y_gpu, ctx);
    const Tensor& mask_cpu = static_cast<DropoutLayer&>(*d.cpu).mask();
    const Tensor mask_gpu = static_cast<DropoutLayer&>(*d.gpu).mask().To(Device::Cpu());
    ASSERT_EQ(mask_gpu.shape(), mask_cpu.shape());
    int64_t differ = 0, first = -1, kept = 0;
    for (int64_t i = 0; i < mask_cpu.numel(); ++i) {
      if (mask_cpu.At(i) != mask_gpu.At(i)) {
        if (first < 0) first = i;
        ++differ;
      }
      kept += mask_cpu.At(i) != 0;
    }
    EXPECT_EQ(differ, 0) << "p " << p << ": " << differ << " mask elements differ, first at row "
                         << first / 37 << " element " << first % 37;
    // The mask is really random (not all kept or all dropped).
    EXPECT_GT(kept, 0) << "p " << p;
    EXPECT_LT(kept, mask_cpu.numel()) << "p " << p;
    EXPECT_EQ(NormalisedError(y_cpu, y_gpu), 0) << "p " << p;
    // Backward: dx = dy * mask, the same on both.
    const Tensor dy = RandomTensor(x.shape(), 22, -1, 1, DType::kF32);
    Tensor dx_cpu = Tensor::Empty(x.shape());
    Tensor dx_gpu = Tensor::Empty(x.shape(), DType::kF32, kGpu);
    const Tensor dyg = dy.To(kGpu);
    d.cpu->Backward({&x}, y_cpu, dy, {&dx_cpu});
    d.gpu->Backward({&xg}, y_gpu, dyg, {&dx_gpu});
    EXPECT_EQ(NormalisedError(dx_cpu, dx_gpu), 0) << "p " << p;
  }
}

TEST(LinearGPU, MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // A sample of rank 3 (F = 60 after the implicit flatten), odd sizes.
  const auto c = CompareWithCpu({Spec("fc", "linear", {{"out", int64_t{13}}})}, Shape{3, 4, 5}, 7);
  EXPECT_LE(c.output, 1e-4) << Describe(c);
  EXPECT_LE(c.input_grad, 1e-4) << Describe(c);
  EXPECT_LE(c.param_grad, 1e-4) << Describe(c);
}

TEST(LinearGPU, WithoutBiasAndStacked) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const auto c =
      CompareWithCpu({Spec("fc1", "linear", {{"out", int64_t{33}}, {"bias", false}}),
                      Spec("relu", "relu"), Spec("fc2", "linear", {{"out", int64_t{10}}})},
                     Shape{70}, 65);
  EXPECT_LE(c.output, 1e-4) << Describe(c);
  EXPECT_LE(c.input_grad, 1e-4) << Describe(c);
  EXPECT_LE(c.param_grad, 1e-4) << Describe(c);
}

TEST(LinearGPU, GradientsAccumulate) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // Two backward passes add: dW after two equals twice dW after one.
  auto gpu = Model::Build({Spec("fc", "linear", {{"out", int64_t{6}}})}, Shape{5},
                          {.seed = 3, .device = kGpu});
  const Tensor x = RandomTensor(Shape{4, 5}, 4, -1, 1, DType::kF32).To(kGpu);
  const Tensor dy = RandomTensor(Shape{4, 6}, 5, -1, 1, DType::kF32).To(kGpu);
  ForwardContext ctx;
  gpu->ZeroGrad();
  gpu->Forward(x, ctx);
  gpu->Backward(dy, {});
  std::vector<Tensor> once;
  for (auto& np : gpu->NamedParameters()) once.push_back(np.param->grad.To(Device::Cpu()));
  gpu->Forward(x, ctx);
  gpu->Backward(dy, {});
  auto params = gpu->NamedParameters();
  ASSERT_EQ(params.size(), 2u);
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor twice = params[i].param->grad.To(Device::Cpu());
    for (int64_t k = 0; k < twice.numel(); ++k) {
      // Not bitwise: the bias adds the rows onto the first sum one by one.
      EXPECT_NEAR(twice.At(k), 2 * once[i].At(k), 1e-5) << params[i].name << " element " << k;
    }
  }
}

// Each layer in bf16 and f16 against the CPU in f32 (the contract's
// thresholds: ~3e-2 for bf16, ~5e-3 for f16, normalised).
double HalfTolerance(DType t) { return t == DType::kBF16 ? 3e-2 : 5e-3; }

class HalfLayersGPU : public ::testing::TestWithParam<DType> {};

TEST_P(HalfLayersGPU, Relu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  const auto c = CompareWithCpu({Spec("relu1", "relu")}, Shape{3, 7}, 5, true, 5, t);
  EXPECT_LE(c.output, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.input_grad, HalfTolerance(t)) << Describe(c);
}

// Every activation type (ops/cuda/activation.cu) on inputs in [-1, 1], for
// the f16/bf16 kernels (the layer table checks f32 against the CPU).
std::vector<LayerSpec> ActivationSpecs() {
  return {Spec("act", "gelu"),
          Spec("act", "gelu", {{"approximate", std::string("tanh")}}),
          Spec("act", "silu"),
          Spec("act", "sigmoid"),
          Spec("act", "tanh"),
          Spec("act", "hardsigmoid"),
          Spec("act", "hardswish"),
          Spec("act", "relu6"),
          Spec("act", "leaky_relu", {{"negative_slope", 0.2}})};
}

TEST_P(HalfLayersGPU, Activations) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  for (const LayerSpec& spec : ActivationSpecs()) {
    SCOPED_TRACE(spec.type);
    const auto c = CompareWithCpu({spec}, Shape{3, 7}, 5, true, 5, t);
    EXPECT_LE(c.output, HalfTolerance(t)) << Describe(c);
    EXPECT_LE(c.input_grad, HalfTolerance(t)) << Describe(c);
  }
}

TEST_P(HalfLayersGPU, ResidualAdd) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  const auto c = CompareWithCpu(
      {Spec("fc1", "linear", {{"out", int64_t{9}}}), Spec("relu1", "relu"),
       Spec("fc2", "linear", {{"out", int64_t{9}}}), Spec("sum", "add", {}, {"fc2", "fc1"}),
       Spec("fc3", "linear", {{"out", int64_t{4}}})},
      Shape{11}, 6, true, 5, t);
  EXPECT_LE(c.output, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.input_grad, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.param_grad, HalfTolerance(t)) << Describe(c);
}

TEST_P(HalfLayersGPU, FlattenAndLinear) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  const auto c =
      CompareWithCpu({Spec("flat", "flatten"), Spec("fc", "linear", {{"out", int64_t{13}}})},
                     Shape{3, 4, 5}, 7, true, 5, t);
  EXPECT_LE(c.output, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.input_grad, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.param_grad, HalfTolerance(t)) << Describe(c);
}

TEST_P(HalfLayersGPU, LinearWithoutBiasStacked) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  // Sizes that are multiples of 8 and not (tensor-core and fallback paths).
  const auto c =
      CompareWithCpu({Spec("fc1", "linear", {{"out", int64_t{64}}, {"bias", false}}),
                      Spec("relu", "relu"), Spec("fc2", "linear", {{"out", int64_t{10}}})},
                     Shape{72}, 65, true, 5, t);
  EXPECT_LE(c.output, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.input_grad, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.param_grad, HalfTolerance(t)) << Describe(c);
}

TEST_P(HalfLayersGPU, LinearEvalForward) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  const auto c =
      CompareWithCpu({Spec("fc", "linear", {{"out", int64_t{8}}})}, Shape{16}, 4, false, 9, t);
  EXPECT_LE(c.output, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.param_grad, HalfTolerance(t)) << Describe(c);
}

TEST_P(HalfLayersGPU, DropoutTrainingAndEval) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  const auto c =
      CompareWithCpu({Spec("drop", "dropout", {{"p", 0.3}})}, Shape{4, 9}, 7, true, 5, t);
  EXPECT_LE(c.output, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.input_grad, HalfTolerance(t)) << Describe(c);
  const auto e = CompareWithCpu({Spec("drop", "dropout", {{"p", 0.5}})}, Shape{13}, 3, false, 5, t);
  EXPECT_LE(e.output, HalfTolerance(t)) << Describe(e);
  EXPECT_LE(e.input_grad, HalfTolerance(t)) << Describe(e);
}

TEST_P(HalfLayersGPU, DropoutKeepsTheCpuDecisions) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  const Shape sample{37};
  const int64_t rows = 300;
  std::vector<int64_t> ids(rows);
  for (int64_t r = 0; r < rows; ++r) ids[r] = (r * 7919 + 13) % 1000003;
  DropoutPair d = MakeDropoutPair(0.4, sample);
  const Tensor x = RandomTensor(sample.WithBatch(rows), 21, -1, 1, DType::kF32);
  for (const bool with_ids : {false, true}) {
    SCOPED_TRACE(with_ids ? "sample ids" : "no sample ids");
    ForwardContext ctx;
    ctx.seed = 99;
    ctx.step = 12;
    ctx.sample_ids = with_ids ? ids.data() : nullptr;
    Tensor y_cpu = Tensor::Empty(x.shape());
    d.cpu->Forward({&x}, y_cpu, ctx);
    Tensor xh = Tensor::Empty(x.shape(), t, kGpu);
    cuda::Cast(x.To(kGpu), xh);
    Tensor yh = Tensor::Empty(x.shape(), t, kGpu);
    d.gpu->Forward({&xh}, yh, ctx);
    const Tensor& mask_cpu = static_cast<DropoutLayer&>(*d.cpu).mask();
    const Tensor& mask_gpu = static_cast<DropoutLayer&>(*d.gpu).mask();
    ASSERT_EQ(mask_gpu.dtype(), t);
    const std::vector<uint16_t> m = Download16(mask_gpu);
    const std::vector<uint16_t> y = Download16(yh);
    int64_t differ = 0, first = -1;
    for (int64_t i = 0; i < x.numel(); ++i) {
      if ((mask_cpu.At(i) != 0) != (HostFrom(t, m[i]) != 0)) {
        if (first < 0) first = i;
        ++differ;
      }
      // y = the rounded x times the f32 scale, rounded once.
      const float xr = HostFrom(t, HostTo(t, static_cast<float>(x.At(i))));
      const uint16_t want = HostTo(t, xr * static_cast<float>(mask_cpu.At(i)));
      ASSERT_EQ(y[i], want) << "y element " << i;
    }
    EXPECT_EQ(differ, 0) << differ << " keep/drop decisions differ, first at " << first;
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, HalfLayersGPU, ::testing::Values(DType::kF16, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(DTypeName(i.param));
                         });

}  // namespace
}  // namespace cnnflow
