// Tests of the cuDNN layers (ops/cuda/conv_cudnn.cc, pooling_cudnn.cc,
// batch_norm_cudnn.cc): every layer's forward and backward on cuda:0
// against the CPU layer on the same inputs and parameters (normalised
// errors, tests/ops/gpu_check.h), BN's running statistics, batch-size
// changes, the no-input-gradient path and SyncBN's kernels; then every
// layer again in mixed precision (bf16 and f16 activations over f32
// parameters) against the CPU's f32. GPU tests skip without a GPU; the
// host-side parts (registration, Build of the CUDA classes, the algorithm
// pick, BN's 4D view, the helpers of ops/cuda/cudnn_util.h) run in any
// CUDA build.
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ops/device_ops.h"
#include "ops/layer.h"
#include "ops/model.h"
#include "tests/ops/gpu_check.h"
#include "tests/testing/test_dir.h"

#if defined(CNNFLOW_WITH_CUDA)
#include <cudnn.h>

#include "ops/cuda/context.h"
#include "ops/cuda/cudnn_picks.h"
#include "ops/cuda/cudnn_util.h"
#include "ops/cuda/elementwise.h"
#endif

namespace cnnflow::testing {
namespace {

using Ints = std::vector<int64_t>;

// Normalised-error thresholds: conv may run on TF32 tensor cores (10-bit
// mantissa, as PyTorch's default); pooling and BN are exact up to f32 sums.
constexpr double kConvTol = 1e-2;
constexpr double kPoolTol = 1e-4;
constexpr double kBnTol = 1e-4;
// Mixed precision against the CPU's f32 (tests/ops/gpu_check.h): inputs,
// weights and results rounded to 8 (bf16) or 11 (f16) significant bits,
// sums in f32.
constexpr double kBf16Tol = 3e-2;
constexpr double kF16Tol = 5e-3;

double HalfTol(DType compute) { return compute == DType::kBF16 ? kBf16Tol : kF16Tol; }

std::string Describe(const GpuCpuComparison& c) {
  std::ostringstream os;
  os << "errors: output " << c.output << ", input grad " << c.input_grad << ", param grad "
     << c.param_grad << " (worst: " << c.worst_param << "), buffers " << c.buffer;
  return os.str();
}

void ExpectMatches(const GpuCpuComparison& c, double tol, const std::string& what) {
  EXPECT_LT(c.output, tol) << what << ": GPU forward output differs from the CPU's; "
                           << Describe(c);
  EXPECT_LT(c.input_grad, tol) << what << ": GPU input gradient differs from the CPU's; "
                               << Describe(c);
  EXPECT_LT(c.param_grad, tol) << what << ": GPU gradient of " << c.worst_param
                               << " differs from the CPU's; " << Describe(c);
  EXPECT_LT(c.buffer, tol) << what << ": GPU buffers (BN running statistics) differ from the "
                           << "CPU's; " << Describe(c);
}

void CheckOne(const LayerSpec& spec, const Shape& sample, int64_t n, double tol,
              bool training = true, DType compute = DType::kF32) {
  ExpectMatches(CompareWithCpu({spec}, sample, n, training, /*seed=*/5, compute), tol,
                StrCat(spec.type, " on ", sample.WithBatch(n), " in ", DTypeName(compute),
                       training ? " (train)" : " (eval)"));
}

// The same model on the CPU (f32) and on cuda:0 (computing in `compute`),
// kept across several steps (the one-shot CompareWithCpu cannot change the
// batch size or the mode, nor take a chosen input).
struct ModelPair {
  std::unique_ptr<Model> cpu, gpu;
  Shape sample;
  DType compute;

  ModelPair(const std::vector<LayerSpec>& specs, const Shape& sample_shape, uint64_t seed = 5,
            DType compute_dtype = DType::kF32)
      : cpu(Model::Build(specs, sample_shape, {.seed = seed})),
        gpu(Model::Build(specs, sample_shape,
                         {.seed = seed, .device = Device::Cuda(0), .compute = compute_dtype})),
        sample(sample_shape),
        compute(compute_dtype) {}

  // An f32 host tensor on cuda:0 in the compute dtype (what the GPU
  // model's Backward takes; its Forward casts the f32 input itself).
  Tensor ToGpu(const Tensor& t) const {
    Tensor g = t.To(Device::Cuda(0));
    if (compute == DType::kF32) return g;
    Tensor h = Tensor::Empty(t.shape(), compute, Device::Cuda(0));
    cuda::Cast(g, h);
    return h;
  }

  // One forward + backward on both of a random batch of n (grads zeroed
  // first); want_dx: whether the input gradient is asked for (else only
  // parameter gradients).
  GpuCpuComparison Step(int64_t n, bool training, uint64_t seed, bool want_dx = true) {
    return Run(RandomTensor(sample.WithBatch(n), seed, -1, 1, DType::kF32), training, seed,
               want_dx);
  }

  // The same on the host f32 batch x, with a random output gradient.
  GpuCpuComparison Run(const Tensor& x, bool training, uint64_t seed, bool want_dx = true) {
    cpu->ZeroGrad();
    gpu->ZeroGrad();
    ForwardContext ctx;
    ctx.training = training;
    ctx.seed = seed;
    const Tensor y_cpu = cpu->Forward(x, ctx).Clone();
    const Tensor y_gpu = ToF32(gpu->Forward(x.To(Device::Cuda(0)), ctx));
    EXPECT_EQ(y_gpu.dtype(), DType::kF32);
    const Tensor dy = RandomTensor(y_cpu.shape(), seed + 1, -1, 1, DType::kF32);
    Tensor dx_cpu, dx_gpu;
    cpu->Backward(dy, {}, want_dx ? &dx_cpu : nullptr);
    gpu->Backward(ToGpu(dy), {}, want_dx ? &dx_gpu : nullptr);
    GpuCpuComparison c;
    c.output = NormalisedError(y_cpu, y_gpu);
    if (want_dx) {
      EXPECT_EQ(dx_gpu.dtype(), compute) << "the input gradient is not in the compute dtype";
      c.input_grad = NormalisedError(dx_cpu, ToF32(dx_gpu));
    }
    auto pc = cpu->NamedParameters();
    auto pg = gpu->NamedParameters();
    for (size_t i = 0; i < pc.size(); ++i) {
      EXPECT_EQ(pg[i].param->grad.dtype(), DType::kF32) << pc[i].name << ": gradient not f32";
      const double e = NormalisedError(pc[i].param->grad, pg[i].param->grad);
      if (e >= c.param_grad) {
        c.param_grad = e;
        c.worst_param = pc[i].name;
      }
    }
    auto sc = cpu->StateTensors();
    auto sg = gpu->StateTensors();
    for (size_t i = 0; i < sc.size(); ++i) {
      c.buffer = std::max(c.buffer, NormalisedError(sc[i].second, sg[i].second));
    }
    return c;
  }
};

// Two forward + backward passes without ZeroGrad: the GPU must add into
// the parameter gradients, as the CPU does (in mixed precision: the half
// result added into the f32 gradient).
void CheckConvGradientsAccumulate(DType compute, double tol) {
  auto specs = std::vector<LayerSpec>{
      Spec("c", "conv2d", {{"out", int64_t{4}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}})};
  ModelPair m(specs, Shape{2, 6, 6}, 5, compute);
  const Tensor x = RandomTensor(Shape{3, 2, 6, 6}, 21, -1, 1, DType::kF32);
  ForwardContext ctx;
  for (int k = 0; k < 2; ++k) {
    const Tensor y = m.cpu->Forward(x, ctx).Clone();
    m.gpu->Forward(x.To(Device::Cuda(0)), ctx);
    const Tensor dy = RandomTensor(y.shape(), 30 + k, -1, 1, DType::kF32);
    m.cpu->Backward(dy);
    m.gpu->Backward(m.ToGpu(dy));
  }
  auto pc = m.cpu->NamedParameters();
  auto pg = m.gpu->NamedParameters();
  for (size_t i = 0; i < pc.size(); ++i) {
    EXPECT_LT(NormalisedError(pc[i].param->grad, pg[i].param->grad), tol)
        << pc[i].name << " in " << DTypeName(compute)
        << ": the GPU gradient after two backward passes is not their sum";
  }
}

// ---------------------------------------------------------------- conv2d

TEST(Conv2dGPU, Same3x3MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOne(Spec("c", "conv2d", {{"out", int64_t{8}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
           Shape{3, 9, 9}, 4, kConvTol);
}

TEST(Conv2dGPU, StridePadDilationMatchCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOne(Spec("c", "conv2d",
                {{"out", int64_t{6}},
                 {"kernel", Ints{3, 2}},
                 {"stride", Ints{2, 1}},
                 {"pad", Ints{1, 2}},
                 {"dilation", Ints{2, 1}}}),
           Shape{4, 11, 10}, 3, kConvTol);
}

TEST(Conv2dGPU, GroupsMatchCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOne(Spec("c", "conv2d",
                {{"out", int64_t{9}},
                 {"kernel", int64_t{3}},
                 {"pad", int64_t{1}},
                 {"groups", int64_t{3}}}),
           Shape{6, 8, 8}, 4, kConvTol);
  // Depthwise: one group per channel, strided.
  CheckOne(Spec("c", "conv2d",
                {{"out", int64_t{8}},
                 {"kernel", int64_t{3}},
                 {"stride", int64_t{2}},
                 {"groups", int64_t{8}}}),
           Shape{8, 9, 9}, 2, kConvTol);
}

TEST(Conv2dGPU, NoBiasMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOne(Spec("c", "conv2d", {{"out", int64_t{5}}, {"kernel", int64_t{3}}, {"bias", false}}),
           Shape{2, 7, 7}, 3, kConvTol);
}

TEST(Conv2dGPU, Pointwise1x1MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOne(Spec("c", "conv2d", {{"out", int64_t{16}}, {"kernel", int64_t{1}}}), Shape{12, 5, 5}, 4,
           kConvTol);
}

TEST(Conv2dGPU, BatchSizeChangesRechooseAlgorithms) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  ModelPair m(
      {Spec("c", "conv2d", {{"out", int64_t{8}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}})},
      Shape{4, 10, 10});
  uint64_t seed = 11;
  for (int64_t n : {4, 7, 1, 4}) {  // back to a batch size already seen: its cached algorithms
    ExpectMatches(m.Step(n, true, seed++), kConvTol, StrCat("conv2d with batch ", n));
  }
}

TEST(Conv2dGPU, WeightGradientsWithoutInputGradient) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // The model's first layer gets no dx when the caller asks for none.
  ModelPair m({Spec("c", "conv2d", {{"out", int64_t{4}}, {"kernel", int64_t{3}}})}, Shape{3, 8, 8});
  ExpectMatches(m.Step(5, true, 3, /*want_dx=*/false), kConvTol, "conv2d without dx");
}

TEST(Conv2dGPU, GradientsAccumulateOverCalls) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckConvGradientsAccumulate(DType::kF32, kConvTol);
}

// ---------------------------------------------------------------- conv1d

TEST(Conv1dGPU, PaddedMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOne(Spec("c", "conv1d", {{"out", int64_t{6}}, {"kernel", int64_t{5}}, {"pad", int64_t{2}}}),
           Shape{3, 30}, 4, kConvTol);
}

TEST(Conv1dGPU, StrideDilationGroupsMatchCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOne(Spec("c", "conv1d",
                {{"out", int64_t{8}},
                 {"kernel", int64_t{3}},
                 {"stride", int64_t{2}},
                 {"dilation", int64_t{2}},
                 {"pad", int64_t{1}},
                 {"groups", int64_t{2}}}),
           Shape{4, 41}, 3, kConvTol);
}

TEST(Conv1dGPU, ManyChannelsMatchCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // C >= 8, stride 1: the CPU's shifted-GEMM lowering, against cuDNN.
  CheckOne(
      Spec("c", "conv1d",
           {{"out", int64_t{16}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}, {"bias", false}}),
      Shape{16, 25}, 4, kConvTol);
}

// ---------------------------------------------------------------- pooling

TEST(MaxPool2dGPU, Plain2x2MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOne(Spec("p", "maxpool2d", {{"kernel", int64_t{2}}}), Shape{3, 8, 10}, 4, kPoolTol);
}

TEST(MaxPool2dGPU, OverlappingPaddedMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // Inputs in [-1, 1]: a padded cell that counted as 0 would win windows
  // whose real cells are all negative.
  CheckOne(
      Spec("p", "maxpool2d", {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"pad", int64_t{1}}}),
      Shape{2, 9, 8}, 3, kPoolTol);
  CheckOne(
      Spec("p", "maxpool2d", {{"kernel", Ints{3, 2}}, {"stride", Ints{1, 2}}, {"pad", Ints{1, 1}}}),
      Shape{2, 5, 7}, 2, kPoolTol);
}

TEST(AvgPool2dGPU, IncludePadMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOne(
      Spec("p", "avgpool2d", {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"pad", int64_t{1}}}),
      Shape{3, 9, 9}, 3, kPoolTol);
}

TEST(AvgPool2dGPU, ExcludePadMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOne(Spec("p", "avgpool2d",
                {{"kernel", int64_t{3}},
                 {"stride", int64_t{2}},
                 {"pad", int64_t{1}},
                 {"count_include_pad", false}}),
           Shape{3, 9, 8}, 3, kPoolTol);
  CheckOne(Spec("p", "avgpool2d", {{"kernel", int64_t{2}}}), Shape{2, 6, 6}, 2, kPoolTol);
}

TEST(GlobalAvgPoolGPU, PlanesMatchCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOne(Spec("g", "global_avgpool"), Shape{5, 7, 6}, 4, kPoolTol);
}

TEST(GlobalAvgPoolGPU, RowsMatchCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOne(Spec("g", "global_avgpool"), Shape{4, 33}, 3, kPoolTol);
}

TEST(MaxPool1dGPU, MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOne(Spec("p", "maxpool1d", {{"kernel", int64_t{2}}}), Shape{3, 20}, 4, kPoolTol);
  CheckOne(
      Spec("p", "maxpool1d", {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"pad", int64_t{1}}}),
      Shape{3, 21}, 2, kPoolTol);
}

TEST(AvgPool1dGPU, MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOne(
      Spec("p", "avgpool1d", {{"kernel", int64_t{4}}, {"stride", int64_t{2}}, {"pad", int64_t{2}}}),
      Shape{3, 19}, 3, kPoolTol);
  CheckOne(Spec("p", "avgpool1d",
                {{"kernel", int64_t{3}},
                 {"stride", int64_t{2}},
                 {"pad", int64_t{1}},
                 {"count_include_pad", false}}),
           Shape{2, 16}, 3, kPoolTol);
}

// ---------------------------------------------------------------- batchnorm

// Training step (output, gradients, running statistics), then an
// evaluation step on the trained running statistics.
void CheckBatchNorm(const LayerSpec& spec, const Shape& sample, int64_t n,
                    DType compute = DType::kF32, double tol = kBnTol) {
  ModelPair m({spec}, sample, 5, compute);
  const std::string what = StrCat("batchnorm on ", sample.WithBatch(n), " in ", DTypeName(compute));
  ExpectMatches(m.Step(n, true, 7), tol, what + " (train)");
  ExpectMatches(m.Step(n, true, 9), tol, what + " (train, second step)");
  ExpectMatches(m.Step(n, false, 13), tol, what + " (eval)");
}

TEST(BatchNormGPU, Planes4dMatchCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckBatchNorm(Spec("bn", "batchnorm"), Shape{4, 6, 5}, 5);
}

TEST(BatchNormGPU, Rows3dMatchCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckBatchNorm(Spec("bn", "batchnorm"), Shape{3, 17}, 4);
}

TEST(BatchNormGPU, Features2dMatchCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckBatchNorm(Spec("bn", "batchnorm"), Shape{10}, 6);
}

TEST(BatchNormGPU, MomentumEpsAndNoAffineMatchCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckBatchNorm(Spec("bn", "batchnorm", {{"momentum", 0.3}, {"eps", 1e-3}}), Shape{3, 4, 4}, 3);
  CheckBatchNorm(Spec("bn", "batchnorm", {{"affine", false}}), Shape{3, 4, 4}, 3);
}

TEST(BatchNormGPU, RunningStatisticsAfterForward) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // Forward only: the running buffers alone must have moved as the CPU's
  // (the unbiased variance, momentum 0.1).
  auto specs = std::vector<LayerSpec>{Spec("bn", "batchnorm")};
  ModelPair m(specs, Shape{4, 3, 3});
  const Tensor x = RandomTensor(Shape{6, 4, 3, 3}, 17, -2, 3, DType::kF32);
  ForwardContext ctx;
  m.cpu->Forward(x, ctx);
  m.gpu->Forward(x.To(Device::Cuda(0)), ctx);
  auto sc = m.cpu->StateTensors();
  auto sg = m.gpu->StateTensors();
  ASSERT_EQ(sc.size(), sg.size());
  for (size_t i = 0; i < sc.size(); ++i) {
    EXPECT_LT(NormalisedError(sc[i].second, sg[i].second), kBnTol)
        << sc[i].first << " after one training forward differs from the CPU's";
  }
}

TEST(BatchNormGPU, ParameterGradientsWithoutInputGradient) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  ModelPair m({Spec("bn", "batchnorm")}, Shape{3, 5, 5});
  ExpectMatches(m.Step(4, true, 5, /*want_dx=*/false), kBnTol, "batchnorm train without dx");
  ExpectMatches(m.Step(4, false, 6, /*want_dx=*/false), kBnTol, "batchnorm eval without dx");
}

// Two training steps, then two evaluation steps, each pair without
// ZeroGrad, at two batch sizes: BN's parameter gradients must add up
// (betaParamDiff = 1, and beta = 1 of the evaluation backward's sums) as
// the CPU's do, and a new batch size must re-set the descriptors.
void CheckBatchNormGradientsAccumulate(DType compute, double tol) {
  ModelPair m({Spec("bn", "batchnorm")}, Shape{3, 4, 5}, 5, compute);
  for (const bool training : {true, false}) {
    m.cpu->ZeroGrad();
    m.gpu->ZeroGrad();
    ForwardContext ctx;
    ctx.training = training;
    for (int k = 0; k < 2; ++k) {
      const Tensor x = RandomTensor(Shape{4 + 2 * k, 3, 4, 5}, 50 + k, -1, 1, DType::kF32);
      const Tensor y = m.cpu->Forward(x, ctx).Clone();
      m.gpu->Forward(x.To(Device::Cuda(0)), ctx);
      const Tensor dy = RandomTensor(y.shape(), 60 + k, -1, 1, DType::kF32);
      m.cpu->Backward(dy);
      m.gpu->Backward(m.ToGpu(dy));
    }
    auto pc = m.cpu->NamedParameters();
    auto pg = m.gpu->NamedParameters();
    ASSERT_EQ(pc.size(), pg.size());
    for (size_t i = 0; i < pc.size(); ++i) {
      EXPECT_LT(NormalisedError(pc[i].param->grad, pg[i].param->grad), tol)
          << pc[i].name << " in " << DTypeName(compute) << (training ? " (train)" : " (eval)")
          << ": the GPU gradient after two backward passes is not their sum";
    }
    auto sc = m.cpu->StateTensors();
    auto sg = m.gpu->StateTensors();
    for (size_t i = 0; i < sc.size(); ++i) {
      EXPECT_LT(NormalisedError(sc[i].second, sg[i].second), tol)
          << sc[i].first << " in " << DTypeName(compute) << " after batches of 4 and 6";
    }
  }
}

TEST(BatchNormGPU, GradientsAccumulateOverCalls) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckBatchNormGradientsAccumulate(DType::kF32, kBnTol);
}

// SyncBN's kernels (ops/cuda/batch_norm_kernels.h) with the sync of one
// replica (the sums as they are) and of two identical replicas (every sum,
// the count too, doubled: the same statistics) against cuDNN's own BN on
// the same batch: output, every gradient and the running statistics, NCHW
// and channels-last, in f32 and bf16.
TEST(BatchNormGPU, SyncedKernelsMatchCudnnOnOneReplica) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const std::function<void(float*, int64_t)> same = [](float*, int64_t) {};
  std::vector<const std::function<void(float*, int64_t)>*> syncs = {&same};
#if defined(CNNFLOW_WITH_CUDA)
  const std::function<void(float*, int64_t)> twice = [](float* data, int64_t count) {
    cuda::ScaleFloats(data, count, 2.f, CudaContext::For(Device::Cuda(0)).stream());
  };
  syncs.push_back(&twice);
#endif
  SetGpuMath(Device::Cuda(0), {.tf32 = false});  // the two models may pick other algorithms
  for (const auto* sync : syncs) {
    for (MemoryFormat layout : {MemoryFormat::kNchw, MemoryFormat::kChannelsLast}) {
      for (DType compute : {DType::kF32, DType::kBF16}) {
        const std::vector<LayerSpec> specs = {
            Spec("c", "conv2d", {{"out", int64_t{6}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
            Spec("bn", "batchnorm", {{"momentum", 0.3}}),
            // A convolution last: the model's output stays NCHW, bn's may not.
            Spec("c2", "conv2d", {{"out", int64_t{2}}, {"kernel", int64_t{1}}})};
        const ModelOptions o{
            .seed = 2, .device = Device::Cuda(0), .compute = compute, .memory_format = layout};
        auto plain = Model::Build(specs, Shape{3, 7, 5}, o);
        auto synced = Model::Build(specs, Shape{3, 7, 5}, o);
        const Tensor x = RandomTensor(Shape{4, 3, 7, 5}, 8, -2, 3, DType::kF32).To(Device::Cuda(0));
        ForwardContext ctx;
        ForwardContext sctx;
        sctx.sync_sum = sync;
        ASSERT_EQ(synced->FindLayer("bn")->nhwc_output(), layout == MemoryFormat::kChannelsLast);
        const double tol = compute == DType::kF32 ? 1e-5 : 2e-2;
        const std::string what =
            StrCat(DTypeName(compute), layout == MemoryFormat::kNchw ? " NCHW" : " NHWC");
        ExpectGpuModelsAgree(*plain, *synced, x, ctx, sctx, compute, 9, tol, what);
      }
    }
  }
  SetGpuMath(Device::Cuda(0), {});
}

// ---------------------------------------------------------------- together

TEST(CudnnLayersGPU, SmallCnnMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const std::vector<LayerSpec> specs = {
      Spec("conv1", "conv2d",
           {{"out", int64_t{8}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}, {"bias", false}}),
      Spec("bn1", "batchnorm"),
      Spec("pool1", "maxpool2d", {{"kernel", int64_t{2}}}),
      Spec("conv2", "conv2d", {{"out", int64_t{12}}, {"kernel", int64_t{3}}, {"bias", false}}),
      Spec("pool2", "avgpool2d", {{"kernel", int64_t{2}}}),
      Spec("gap", "global_avgpool"),
  };
  ModelPair m(specs, Shape{3, 14, 14});
  // conv1 has no bias, as convolutions before a BN have: training-mode BN
  // cancels a bias's gradient, leaving rounding noise on either device.
  // TF32 errors pass through BN (which rescales them): a looser bound.
  ExpectMatches(m.Step(6, true, 41), 3 * kConvTol, "conv-bn-pool CNN (train)");
  ExpectMatches(m.Step(6, false, 43), 3 * kConvTol, "conv-bn-pool CNN (eval)");
}

// ---------------------------------------------------------------- mixed precision

// Every layer with bf16 / f16 activations over f32 parameters (Model::Build
// with a compute dtype) against the CPU layer in f32.
class HalfPrecisionGPU : public ::testing::TestWithParam<DType> {
 protected:
  DType compute() const { return GetParam(); }
  double tol() const { return HalfTol(GetParam()); }
};

// [N, C, ...] values ((37 i) mod 255 - 127) / 128: exact in bf16 and f16,
// and distinct within any 255 consecutive elements, so no two cells of a
// max-pooling window tie after rounding (a tie the CPU's f32 does not see
// would send the gradient to another cell).
Tensor DistinctExactValues(const Shape& shape) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.Set(i, static_cast<double>((37 * i) % 255 - 127) / 128);
  return t;
}

TEST_P(HalfPrecisionGPU, Conv2dMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOne(Spec("c", "conv2d", {{"out", int64_t{8}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
           Shape{3, 9, 9}, 4, tol(), true, compute());
  CheckOne(Spec("c", "conv2d",
                {{"out", int64_t{6}},
                 {"kernel", Ints{3, 2}},
                 {"stride", Ints{2, 1}},
                 {"pad", Ints{1, 2}},
                 {"dilation", Ints{2, 1}}}),
           Shape{4, 11, 10}, 3, tol(), true, compute());
  CheckOne(Spec("c", "conv2d",
                {{"out", int64_t{9}},
                 {"kernel", int64_t{3}},
                 {"pad", int64_t{1}},
                 {"groups", int64_t{3}}}),
           Shape{6, 8, 8}, 4, tol(), true, compute());
  CheckOne(Spec("c", "conv2d", {{"out", int64_t{5}}, {"kernel", int64_t{3}}, {"bias", false}}),
           Shape{2, 7, 7}, 3, tol(), true, compute());
  CheckOne(Spec("c", "conv2d", {{"out", int64_t{16}}, {"kernel", int64_t{1}}}), Shape{12, 5, 5}, 4,
           tol(), /*training=*/false, compute());
}

TEST_P(HalfPrecisionGPU, Conv2dBatchSizesAndNoInputGradient) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  ModelPair m(
      {Spec("c", "conv2d", {{"out", int64_t{8}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}})},
      Shape{4, 10, 10}, 5, compute());
  uint64_t seed = 11;
  for (int64_t n : {4, 7, 1, 4}) {
    ExpectMatches(m.Step(n, true, seed++), tol(),
                  StrCat("conv2d in ", DTypeName(compute()), " with batch ", n));
  }
  ExpectMatches(m.Step(5, true, 3, /*want_dx=*/false), tol(),
                StrCat("conv2d in ", DTypeName(compute()), " without dx"));
}

TEST_P(HalfPrecisionGPU, Conv2dGradientsAccumulateInF32) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckConvGradientsAccumulate(compute(), tol());
}

TEST_P(HalfPrecisionGPU, Conv1dMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOne(Spec("c", "conv1d", {{"out", int64_t{6}}, {"kernel", int64_t{5}}, {"pad", int64_t{2}}}),
           Shape{3, 30}, 4, tol(), true, compute());
  CheckOne(Spec("c", "conv1d",
                {{"out", int64_t{8}},
                 {"kernel", int64_t{3}},
                 {"stride", int64_t{2}},
                 {"dilation", int64_t{2}},
                 {"pad", int64_t{1}},
                 {"groups", int64_t{2}}}),
           Shape{4, 41}, 3, tol(), true, compute());
}

TEST_P(HalfPrecisionGPU, MaxPoolMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  struct Case {
    LayerSpec spec;
    Shape sample;
  };
  const std::vector<Case> cases = {
      {Spec("p", "maxpool2d", {{"kernel", int64_t{2}}}), Shape{3, 8, 10}},
      {Spec("p", "maxpool2d",
            {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"pad", int64_t{1}}}),
       Shape{2, 9, 8}},
      {Spec("p", "maxpool1d",
            {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"pad", int64_t{1}}}),
       Shape{3, 21}},
  };
  for (const Case& c : cases) {
    ModelPair m({c.spec}, c.sample, 5, compute());
    ExpectMatches(m.Run(DistinctExactValues(c.sample.WithBatch(3)), true, 8), tol(),
                  StrCat(c.spec.type, " on ", c.sample.WithBatch(3), " in ", DTypeName(compute())));
  }
}

TEST_P(HalfPrecisionGPU, AveragePoolsMatchCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOne(
      Spec("p", "avgpool2d", {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"pad", int64_t{1}}}),
      Shape{3, 9, 9}, 3, tol(), true, compute());
  CheckOne(Spec("p", "avgpool2d",
                {{"kernel", int64_t{3}},
                 {"stride", int64_t{2}},
                 {"pad", int64_t{1}},
                 {"count_include_pad", false}}),
           Shape{3, 9, 8}, 3, tol(), true, compute());
  CheckOne(Spec("g", "global_avgpool"), Shape{5, 7, 6}, 4, tol(), true, compute());
  CheckOne(Spec("g", "global_avgpool"), Shape{4, 33}, 3, tol(), true, compute());
  CheckOne(
      Spec("p", "avgpool1d", {{"kernel", int64_t{4}}, {"stride", int64_t{2}}, {"pad", int64_t{2}}}),
      Shape{3, 19}, 3, tol(), true, compute());
}

TEST_P(HalfPrecisionGPU, BatchNormMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // Train, train again (running statistics), then eval with its backward.
  CheckBatchNorm(Spec("bn", "batchnorm"), Shape{4, 6, 5}, 5, compute(), tol());
  CheckBatchNorm(Spec("bn", "batchnorm"), Shape{3, 17}, 4, compute(), tol());
  CheckBatchNorm(Spec("bn", "batchnorm"), Shape{10}, 6, compute(), tol());
  CheckBatchNorm(Spec("bn", "batchnorm", {{"affine", false}}), Shape{3, 4, 4}, 3, compute(), tol());
}

TEST_P(HalfPrecisionGPU, BatchNormGradientsAccumulateInF32) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckBatchNormGradientsAccumulate(compute(), tol());
}

TEST_P(HalfPrecisionGPU, BatchNormParameterGradientsWithoutInputGradient) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  ModelPair m({Spec("bn", "batchnorm")}, Shape{3, 5, 5}, 5, compute());
  ExpectMatches(m.Step(4, true, 5, /*want_dx=*/false), tol(), "batchnorm train without dx");
  ExpectMatches(m.Step(4, false, 6, /*want_dx=*/false), tol(), "batchnorm eval without dx");
}

TEST_P(HalfPrecisionGPU, SmallCnnMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // Average pools only: after BN, rounded values tie in max windows where
  // the CPU's f32 ones do not (see DistinctExactValues).
  const std::vector<LayerSpec> specs = {
      Spec("conv1", "conv2d",
           {{"out", int64_t{8}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}, {"bias", false}}),
      Spec("bn1", "batchnorm"),
      Spec("pool1", "avgpool2d", {{"kernel", int64_t{2}}}),
      Spec("conv2", "conv2d", {{"out", int64_t{12}}, {"kernel", int64_t{3}}, {"bias", false}}),
      Spec("gap", "global_avgpool"),
  };
  ModelPair m(specs, Shape{3, 14, 14}, 5, compute());
  // Rounding errors of three layers add up and pass through BN: 2x.
  ExpectMatches(m.Step(6, true, 41), 2 * tol(), "conv-bn-pool CNN (train)");
  ExpectMatches(m.Step(6, false, 43), 2 * tol(), "conv-bn-pool CNN (eval)");
}

INSTANTIATE_TEST_SUITE_P(MixedPrecision, HalfPrecisionGPU,
                         ::testing::Values(DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// ---------------------------------------------------------------- host side

TEST(CudnnLayers, EveryTypeHasACudaClass) {
#if !defined(CNNFLOW_WITH_CUDA)
  GTEST_SKIP() << "built without CUDA";
#else
  for (const char* t : {"conv2d", "conv1d", "maxpool2d", "avgpool2d", "global_avgpool", "maxpool1d",
                        "avgpool1d", "batchnorm"}) {
    const LayerType* lt = LayerRegistry::Get().Find(t);
    ASSERT_NE(lt, nullptr) << t << " is not registered";
    EXPECT_NE(LayerRegistry::Get().Find(t, kCudaVariant), nullptr) << t << " has no CUDA class";
  }
#endif
}

TEST(CudnnLayers, CudaClassesBuildLikeTheCpuOnes) {
#if !defined(CNNFLOW_WITH_CUDA)
  GTEST_SKIP() << "built without CUDA";
#else
  // Build and ResetParameters run on the host for a GPU model: the CUDA
  // class must give the CPU class's shapes and initial values (no GPU here).
  struct Case {
    const char* type;
    std::vector<std::pair<std::string, ParamValue>> args;
    Shape input;
  };
  const std::vector<Case> cases = {
      {"conv2d", {{"out", int64_t{4}}, {"kernel", int64_t{3}}, {"groups", int64_t{2}}}, {2, 6, 6}},
      {"conv1d", {{"out", int64_t{4}}, {"kernel", int64_t{3}}, {"stride", int64_t{2}}}, {2, 9}},
      {"maxpool2d",
       {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"pad", int64_t{1}}},
       {2, 7, 7}},
      {"avgpool2d", {{"kernel", int64_t{2}}}, {2, 6, 5}},
      {"global_avgpool", {}, {3, 4, 4}},
      {"maxpool1d", {{"kernel", int64_t{2}}}, {2, 9}},
      {"avgpool1d", {{"kernel", int64_t{3}}, {"pad", int64_t{1}}}, {2, 9}},
      {"batchnorm", {{"affine", false}}, {3, 5}},
  };
  for (const Case& c : cases) {
    const LayerType* lt = LayerRegistry::Get().Find(c.type);
    ASSERT_NE(lt, nullptr) << c.type;
    Args args;
    for (const auto& [k, v] : c.args) args.Set(k, v);
    args.FillDefaults(lt->schema);
    auto cpu = lt->create("l", args);
    auto gpu = LayerRegistry::Get().Find(c.type, kCudaVariant)->create("l", args);
    EXPECT_STREQ(cpu->type(), gpu->type());
    EXPECT_EQ(cpu->Build({c.input}, DType::kF32), gpu->Build({c.input}, DType::kF32)) << c.type;
    Rng r1(4), r2(4);
    cpu->ResetParameters(r1);
    gpu->ResetParameters(r2);
    ASSERT_EQ(cpu->parameters().size(), gpu->parameters().size()) << c.type;
    for (size_t i = 0; i < cpu->parameters().size(); ++i) {
      const Tensor& a = cpu->parameters()[i].value;
      const Tensor& b = gpu->parameters()[i].value;
      ASSERT_EQ(a.shape(), b.shape()) << c.type;
      for (int64_t j = 0; j < a.numel(); ++j) ASSERT_EQ(a.At(j), b.At(j)) << c.type;
    }
    EXPECT_EQ(cpu->buffers().size(), gpu->buffers().size()) << c.type;
  }
#endif
}

TEST(CudnnLayers, AlgorithmPickSkipsFailedOversizedAndDownConverting) {
#if !defined(CNNFLOW_WITH_CUDA)
  GTEST_SKIP() << "built without CUDA";
#else
  const int ok = CUDNN_STATUS_SUCCESS, bad = CUDNN_STATUS_NOT_SUPPORTED;
  const int def = CUDNN_DEFAULT_MATH, tc = CUDNN_TENSOR_OP_MATH,
            conv = CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
  const int det = CUDNN_DETERMINISTIC;
  // Sorted fastest first, as cuDNN returns them.
  const int status[] = {bad, ok, ok, ok, ok};
  const int math[] = {def, conv, def, tc, def};
  const int determinism[] = {det, det, det, det, det};
  const size_t memory[] = {0, 0, 1000, 10, 0};
  const detail::CudnnPickRules f32, f16{.allow_down_conversion = true};
  // f32: the down-converting one and the one over the limit are skipped.
  EXPECT_EQ(detail::PickCudnnAlgo(status, math, determinism, memory, 5, 100, f32), 3);
  // f16 data may use the converting algorithm.
  EXPECT_EQ(detail::PickCudnnAlgo(status, math, determinism, memory, 5, 100, f16), 1);
  // A bigger workspace admits the faster algorithm 2.
  EXPECT_EQ(detail::PickCudnnAlgo(status, math, determinism, memory, 5, 1000, f32), 2);
  // Only failures: none.
  EXPECT_EQ(detail::PickCudnnAlgo(status, math, determinism, memory, 1, 1000, f16), -1);
  EXPECT_EQ(detail::PickCudnnAlgo(status, math, determinism, memory, 0, 1000, f16), -1);
#endif
}

// graph.tf32: false skips tensor-op algorithms; graph.deterministic skips
// the non-deterministic ones (issue 55).
TEST(CudnnLayers, AlgorithmPickKeepsTf32AndDeterminismRules) {
#if !defined(CNNFLOW_WITH_CUDA)
  GTEST_SKIP() << "built without CUDA";
#else
  const int ok = CUDNN_STATUS_SUCCESS;
  const int def = CUDNN_DEFAULT_MATH, tc = CUDNN_TENSOR_OP_MATH, fma = CUDNN_FMA_MATH,
            conv = CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
  const int det = CUDNN_DETERMINISTIC, nondet = CUDNN_NON_DETERMINISTIC;
  const int status[] = {ok, ok, ok, ok, ok};
  const int math[] = {tc, conv, def, fma, fma};
  const int determinism[] = {det, det, nondet, nondet, det};
  const size_t memory[] = {0, 0, 0, 0, 0};
  const detail::CudnnPickRules tf32;
  const detail::CudnnPickRules no_tf32{.allow_tensor_ops = false};
  const detail::CudnnPickRules deterministic{.deterministic_only = true};
  const detail::CudnnPickRules both{.allow_tensor_ops = false, .deterministic_only = true};
  const detail::CudnnPickRules f16_both{
      .allow_down_conversion = true, .allow_tensor_ops = false, .deterministic_only = true};
  EXPECT_EQ(detail::PickCudnnAlgo(status, math, determinism, memory, 5, 0, tf32), 0);
  // No tensor-op math: the default-math one (run as FMA) is the first left.
  EXPECT_EQ(detail::PickCudnnAlgo(status, math, determinism, memory, 5, 0, no_tf32), 2);
  EXPECT_EQ(detail::PickCudnnAlgo(status, math, determinism, memory, 5, 0, deterministic), 0);
  EXPECT_EQ(detail::PickCudnnAlgo(status, math, determinism, memory, 5, 0, both), 4);
  // Converting math is tensor-op math too.
  EXPECT_EQ(detail::PickCudnnAlgo(status, math, determinism, memory, 5, 0, f16_both), 4);
  // Nothing deterministic among the first four: none.
  EXPECT_EQ(detail::PickCudnnAlgo(status, math, determinism, memory, 4, 0, both), -1);
#endif
}

// graph.deterministic's picks file (ops/cuda/cudnn_picks.h), host side: a
// pick is written at once, a file's picks win over this process's (a resume
// runs the picks of the run it resumes), the first record of a key holds,
// and a malformed line names the file and the line.
TEST(CudnnLayers, PicksFileIsWrittenLoadedAndWinsOnResume) {
#if !defined(CNNFLOW_WITH_CUDA)
  GTEST_SKIP() << "built without CUDA";
#else
  const std::string dir = TestDir();
  const std::string file = dir + "/cudnn-picks.tsv";
  cuda::SetCudnnPicksFile(file, true);
  EXPECT_EQ(cuda::FindCudnnPick("gpu A", "forward f32 n8 test-1"), "");
  EXPECT_EQ(cuda::RecordCudnnPick("gpu A", "forward f32 n8 test-1", "1 2"), "1 2");
  EXPECT_EQ(cuda::RecordCudnnPick("gpu A", "forward f32 n8 test-1", "7 0"), "1 2") << "first wins";
  std::string text = ReadBytes(file);
  EXPECT_NE(text.find("gpu A\tforward f32 n8 test-1\t1 2\n"), std::string::npos) << text;
  // The run resumed: its file says otherwise for test-1, and has test-2.
  const std::string resumed = dir + "/resumed.tsv";
  WriteBytes(resumed,
             "# a comment\ngpu A\tforward f32 n8 test-1\t0 1\ngpu B\tbackward-data x\t3 0\n");
  cuda::SetCudnnPicksFile(resumed, true);
  EXPECT_EQ(cuda::FindCudnnPick("gpu A", "forward f32 n8 test-1"), "0 1");
  EXPECT_EQ(cuda::FindCudnnPick("gpu B", "backward-data x"), "3 0");
  EXPECT_EQ(cuda::FindCudnnPick("gpu A", "backward-data x"), "") << "another machine's pick";
  cuda::RecordCudnnPick("gpu A", "forward f32 n8 test-2", "5 1");
  text = ReadBytes(resumed);
  EXPECT_NE(text.find("gpu A\tforward f32 n8 test-1\t0 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gpu A\tforward f32 n8 test-2\t5 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gpu B\tbackward-data x\t3 0\n"), std::string::npos) << text;
  // A process that does not write (rank k > 0) leaves the file alone.
  const std::string other = dir + "/other.tsv";
  cuda::SetCudnnPicksFile(other, false);
  cuda::RecordCudnnPick("gpu A", "forward f32 n8 test-3", "2 1");
  EXPECT_FALSE(std::filesystem::exists(other));
  WriteBytes(other, "gpu A only two fields\n");
  try {
    cuda::SetCudnnPicksFile(other, false);
    ADD_FAILURE() << "a malformed picks file was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(other + ":1:"), std::string::npos) << e.what();
  }
  cuda::SetCudnnPicksFile("", false);
#endif
}

// Sets graph.tf32 / graph.deterministic on cuda:0 for a test, and back.
struct GpuMathFor {
  explicit GpuMathFor(const GpuMathOptions& math) { SetGpuMath(Device::Cuda(0), math); }
  ~GpuMathFor() { SetGpuMath(Device::Cuda(0), GpuMathOptions()); }
};

// A conv2d on cuda:0 against the CPU's f64 on the same f32 values (input,
// weight, bias): the output's and the weight gradient's normalised errors.
std::pair<double, double> ConvErrorAgainstF64(const GpuMathOptions& math) {
  const GpuMathFor set(math);
  const std::vector<LayerSpec> specs = {
      Spec("c", "conv2d", {{"out", int64_t{64}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}})};
  const Shape sample{64, 16, 16};
  auto gpu = Model::Build(specs, sample, {.seed = 7, .device = Device::Cuda(0)});
  auto ref = Model::Build(specs, sample, {.dtype = DType::kF64, .seed = 7});
  auto pg = gpu->NamedParameters(), pr = ref->NamedParameters();
  for (size_t i = 0; i < pg.size(); ++i) {  // the GPU's f32 values, exactly
    const Tensor v = pg[i].param->value.To(Device::Cpu());
    for (int64_t j = 0; j < v.numel(); ++j) pr[i].param->value.Set(j, v.At(j));
  }
  const Tensor x = RandomTensor(sample.WithBatch(8), 8, -1, 1, DType::kF32);
  Tensor x64 = Tensor::Empty(x.shape(), DType::kF64);
  for (int64_t j = 0; j < x.numel(); ++j) x64.Set(j, x.At(j));
  ForwardContext ctx;
  ctx.training = true;
  const Tensor y_ref = ref->Forward(x64, ctx).Clone();
  const Tensor y_gpu = gpu->Forward(x.To(Device::Cuda(0)), ctx).To(Device::Cpu());
  const Tensor dy = RandomTensor(y_ref.shape(), 9, -1, 1, DType::kF32);
  Tensor dy64 = Tensor::Empty(dy.shape(), DType::kF64);
  for (int64_t j = 0; j < dy.numel(); ++j) dy64.Set(j, dy.At(j));
  ref->Backward(dy64);
  gpu->Backward(dy.To(Device::Cuda(0)));
  return {NormalisedError(y_ref, y_gpu), NormalisedError(ref->NamedParameters()[0].param->grad,
                                                         gpu->NamedParameters()[0].param->grad)};
}

// graph.tf32: false gives full f32 convolutions: far closer to f64 than
// TF32's 10-bit products (on a GPU with TF32: Ampere and later).
TEST(Conv2dGPU, Tf32OffIsCloserToF64ThanTf32On) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const auto [fma_y, fma_dw] = ConvErrorAgainstF64({.tf32 = false});
  const auto [tf32_y, tf32_dw] = ConvErrorAgainstF64({.tf32 = true});
  std::cout << "normalised error against f64: tf32 off " << fma_y << " (output), " << fma_dw
            << " (weight grad); tf32 on " << tf32_y << ", " << tf32_dw << "\n";
  EXPECT_LT(fma_y, 1e-5);
  EXPECT_LT(fma_dw, 1e-5);
  if (tf32_y < 1e-5) GTEST_SKIP() << "this GPU has no TF32: both runs are f32";
  EXPECT_LT(fma_y * 10, tf32_y);
  EXPECT_LT(fma_dw * 10, tf32_dw);
}

// graph.deterministic: cuDNN's heuristics, deterministic algorithms only:
// two models built alike give the same bits, and each pass's pick is
// recorded for the shape.
TEST(Conv2dGPU, DeterministicModeRepeatsBitwise) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const GpuMathFor set({.deterministic = true});
  const std::vector<LayerSpec> specs = {
      Spec("c", "conv2d", {{"out", int64_t{32}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Spec("d", "conv2d", {{"out", int64_t{16}}, {"kernel", int64_t{5}}, {"stride", int64_t{2}}})};
  const Shape sample{16, 20, 20};
  const Tensor x = RandomTensor(sample.WithBatch(12), 3, -1, 1, DType::kF32).To(Device::Cuda(0));
  std::vector<std::vector<Tensor>> runs;
  for (int run = 0; run < 2; ++run) {
    auto m = Model::Build(specs, sample, {.seed = 4, .device = Device::Cuda(0)});
    ForwardContext ctx;
    ctx.training = true;
    const Tensor y = m->Forward(x, ctx).To(Device::Cpu());
    const Tensor dy = RandomTensor(y.shape(), 5, -1, 1, DType::kF32);
    Tensor dx;
    m->Backward(dy.To(Device::Cuda(0)), {}, &dx);
    std::vector<Tensor> out = {y, dx.To(Device::Cpu())};
    for (auto& p : m->NamedParameters()) out.push_back(p.param->grad.To(Device::Cpu()));
    runs.push_back(std::move(out));
  }
  for (size_t i = 0; i < runs[0].size(); ++i) {
    ASSERT_EQ(runs[0][i].nbytes(), runs[1][i].nbytes());
    EXPECT_EQ(std::memcmp(runs[0][i].raw_data(), runs[1][i].raw_data(), runs[0][i].nbytes()), 0)
        << "tensor " << i << " differs between two deterministic runs";
  }
}

TEST(CudnnLayers, OnlyF16MayConvertDown) {
#if !defined(CNNFLOW_WITH_CUDA)
  GTEST_SKIP() << "built without CUDA";
#else
  EXPECT_TRUE(detail::CudnnMayDownConvert(CUDNN_DATA_HALF));
  EXPECT_FALSE(detail::CudnnMayDownConvert(CUDNN_DATA_FLOAT)) << "f32 would lose precision";
  EXPECT_FALSE(detail::CudnnMayDownConvert(CUDNN_DATA_BFLOAT16)) << "bf16 would lose range";
#endif
}

TEST(CudnnLayers, DataTypesDimensionsAndLabels) {
#if !defined(CNNFLOW_WITH_CUDA)
  GTEST_SKIP() << "built without CUDA";
#else
  EXPECT_EQ(detail::CudnnDataTypeOf(DType::kF32, "l"), CUDNN_DATA_FLOAT);
  EXPECT_EQ(detail::CudnnDataTypeOf(DType::kF16, "l"), CUDNN_DATA_HALF);
  EXPECT_EQ(detail::CudnnDataTypeOf(DType::kBF16, "l"), CUDNN_DATA_BFLOAT16);
  try {
    detail::CudnnDataTypeOf(DType::kF64, "conv2d 'c1'");
    FAIL() << "f64 should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv2d 'c1'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("f64"), std::string::npos) << e.what();
  }
  EXPECT_EQ(detail::CudnnInt(INT_MAX, "l", "batch size"), INT_MAX);
  try {
    detail::CudnnInt(int64_t{INT_MAX} + 1, "maxpool2d 'p'", "batch size");
    FAIL() << "a dimension over INT_MAX should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("maxpool2d 'p'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("batch size"), std::string::npos) << e.what();
  }
  // The label of a CUDA layer names its type and name, and is kept.
  Args args;
  args.Set("kernel", int64_t{2});
  const LayerType* lt = LayerRegistry::Get().Find("maxpool2d");
  ASSERT_NE(lt, nullptr);
  args.FillDefaults(lt->schema);
  auto layer = LayerRegistry::Get().Find("maxpool2d", kCudaVariant)->create("pool7", args);
  detail::LayerLabel label;
  EXPECT_EQ(label.Of(*layer), "maxpool2d 'pool7'");
  EXPECT_EQ(&label.Of(*layer), &label.Of(*layer));
#endif
}

TEST(CudnnLayers, BatchNormSeesEveryInputAsNchw) {
#if !defined(CNNFLOW_WITH_CUDA)
  GTEST_SKIP() << "built without CUDA";
#else
  EXPECT_EQ(detail::BatchNormCudnnDims({8, 10}), (Ints{8, 10, 1, 1}));
  EXPECT_EQ(detail::BatchNormCudnnDims({8, 3, 17}), (Ints{8, 3, 1, 17}));
  EXPECT_EQ(detail::BatchNormCudnnDims({8, 3, 5, 6}), (Ints{8, 3, 5, 6}));
  EXPECT_TRUE(detail::BatchNormCudnnDims({8}).empty());
  EXPECT_TRUE(detail::BatchNormCudnnDims({1, 2, 3, 4, 5}).empty());
#endif
}

}  // namespace
}  // namespace cnnflow::testing
