// Tests of the cuDNN layers (ops/cuda/conv_cudnn.cc, pooling_cudnn.cc,
// batch_norm_cudnn.cc): every layer's forward and backward on cuda:0
// against the CPU layer on the same inputs and parameters (normalised
// errors, tests/ops/gpu_check.h), BN's running statistics, batch-size
// changes, the no-input-gradient path and SyncBN's refusal. GPU tests skip
// without a GPU; the host-side parts (registration, Build of the CUDA
// classes, the algorithm pick, BN's 4D view) run in any CUDA build.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ops/layer.h"
#include "ops/model.h"
#include "tests/ops/gpu_check.h"

#if defined(CNNFLOW_WITH_CUDA)
#include <cudnn.h>

namespace cnnflow::detail {
// Defined in ops/cuda/conv_cudnn.cc and ops/cuda/batch_norm_cudnn.cc.
int PickCudnnAlgo(const int* status, const int* math_type, const size_t* memory, int count,
                  size_t workspace_limit, bool allow_down_conversion);
std::vector<int64_t> BatchNormCudnnDims(const std::vector<int64_t>& shape);
}  // namespace cnnflow::detail
#endif

namespace cnnflow::testing {
namespace {

using Ints = std::vector<int64_t>;

// Normalised-error thresholds: conv may run on TF32 tensor cores (10-bit
// mantissa, as PyTorch's default); pooling and BN are exact up to f32 sums.
constexpr double kConvTol = 1e-2;
constexpr double kPoolTol = 1e-4;
constexpr double kBnTol = 1e-4;

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
              bool training = true) {
  ExpectMatches(CompareWithCpu({spec}, sample, n, training), tol,
                StrCat(spec.type, " on ", sample.WithBatch(n), training ? " (train)" : " (eval)"));
}

// The same model on the CPU and on cuda:0, kept across several steps (the
// one-shot CompareWithCpu cannot change the batch size or the mode).
struct ModelPair {
  std::unique_ptr<Model> cpu, gpu;
  Shape sample;

  ModelPair(const std::vector<LayerSpec>& specs, const Shape& sample_shape, uint64_t seed = 5)
      : cpu(Model::Build(specs, sample_shape, DType::kF32, seed)),
        gpu(Model::Build(specs, sample_shape, DType::kF32, seed, InitScheme::kPytorchDefault,
                         Device::Cuda(0))),
        sample(sample_shape) {}

  // One forward + backward on both (grads zeroed first); want_dx: whether
  // the input gradient is asked for (else only parameter gradients).
  GpuCpuComparison Step(int64_t n, bool training, uint64_t seed, bool want_dx = true) {
    cpu->ZeroGrad();
    gpu->ZeroGrad();
    const Tensor x = RandomTensor(sample.WithBatch(n), seed, -1, 1, DType::kF32);
    ForwardContext ctx;
    ctx.training = training;
    ctx.seed = seed;
    const Tensor y_cpu = cpu->Forward(x, ctx).Clone();
    const Tensor y_gpu = gpu->Forward(x.To(Device::Cuda(0)), ctx).Clone();
    const Tensor dy = RandomTensor(y_cpu.shape(), seed + 1, -1, 1, DType::kF32);
    Tensor dx_cpu, dx_gpu;
    cpu->Backward(dy, {}, want_dx ? &dx_cpu : nullptr);
    gpu->Backward(dy.To(Device::Cuda(0)), {}, want_dx ? &dx_gpu : nullptr);
    GpuCpuComparison c;
    c.output = NormalisedError(y_cpu, y_gpu);
    if (want_dx) c.input_grad = NormalisedError(dx_cpu, dx_gpu);
    auto pc = cpu->NamedParameters();
    auto pg = gpu->NamedParameters();
    for (size_t i = 0; i < pc.size(); ++i) {
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
  // Two backward passes without ZeroGrad: the GPU must add, as the CPU does.
  auto specs = std::vector<LayerSpec>{
      Spec("c", "conv2d", {{"out", int64_t{4}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}})};
  ModelPair m(specs, Shape{2, 6, 6});
  const Tensor x = RandomTensor(Shape{3, 2, 6, 6}, 21, -1, 1, DType::kF32);
  ForwardContext ctx;
  for (int k = 0; k < 2; ++k) {
    const Tensor y = m.cpu->Forward(x, ctx).Clone();
    m.gpu->Forward(x.To(Device::Cuda(0)), ctx);
    const Tensor dy = RandomTensor(y.shape(), 30 + k, -1, 1, DType::kF32);
    m.cpu->Backward(dy);
    m.gpu->Backward(dy.To(Device::Cuda(0)));
  }
  auto pc = m.cpu->NamedParameters();
  auto pg = m.gpu->NamedParameters();
  for (size_t i = 0; i < pc.size(); ++i) {
    EXPECT_LT(NormalisedError(pc[i].param->grad, pg[i].param->grad), kConvTol)
        << pc[i].name << ": the GPU gradient after two backward passes is not their sum";
  }
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
void CheckBatchNorm(const LayerSpec& spec, const Shape& sample, int64_t n) {
  ModelPair m({spec}, sample);
  const std::string what = StrCat("batchnorm on ", sample.WithBatch(n));
  ExpectMatches(m.Step(n, true, 7), kBnTol, what + " (train)");
  ExpectMatches(m.Step(n, true, 9), kBnTol, what + " (train, second step)");
  ExpectMatches(m.Step(n, false, 13), kBnTol, what + " (eval)");
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

TEST(BatchNormGPU, SyncBatchNormIsRefused) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  auto gpu = Model::Build({Spec("bn", "batchnorm")}, Shape{2, 3, 3}, DType::kF32, 1,
                          InitScheme::kPytorchDefault, Device::Cuda(0));
  const std::function<void(float*, int64_t)> sum = [](float*, int64_t) {};
  ForwardContext ctx;
  ctx.sync_sum = &sum;
  const Tensor x = RandomTensor(Shape{4, 2, 3, 3}, 3, -1, 1, DType::kF32).To(Device::Cuda(0));
  try {
    gpu->Forward(x, ctx);
    FAIL() << "SyncBN on a GPU should have thrown";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not supported on a GPU"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'bn'"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- together

TEST(CudnnLayersGPU, SmallCnnMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const std::vector<LayerSpec> specs = {
      Spec("conv1", "conv2d", {{"out", int64_t{8}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Spec("bn1", "batchnorm"),
      Spec("pool1", "maxpool2d", {{"kernel", int64_t{2}}}),
      Spec("conv2", "conv2d", {{"out", int64_t{12}}, {"kernel", int64_t{3}}, {"bias", false}}),
      Spec("pool2", "avgpool2d", {{"kernel", int64_t{2}}}),
      Spec("gap", "global_avgpool"),
  };
  ModelPair m(specs, Shape{3, 14, 14});
  // TF32 errors pass through BN (which rescales them): a looser bound.
  ExpectMatches(m.Step(6, true, 41), 3 * kConvTol, "conv-bn-pool CNN (train)");
  ExpectMatches(m.Step(6, false, 43), 3 * kConvTol, "conv-bn-pool CNN (eval)");
}

// ---------------------------------------------------------------- host side

TEST(CudnnLayers, EveryTypeHasACudaClass) {
#if !defined(CNNFLOW_WITH_CUDA)
  GTEST_SKIP() << "built without CUDA";
#else
  for (const char* t : {"conv2d", "conv1d", "maxpool2d", "avgpool2d", "global_avgpool", "maxpool1d",
                        "avgpool1d", "batchnorm"}) {
    const LayerType* lt = LayerRegistry::Get().Find(t);
    ASSERT_NE(lt, nullptr) << t << " is not registered";
    EXPECT_TRUE(static_cast<bool>(lt->create_cuda)) << t << " has no CUDA class";
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
    std::vector<std::pair<std::string, ParamValue> > args;
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
    auto gpu = lt->create_cuda("l", args);
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
  // Sorted fastest first, as cuDNN returns them.
  const int status[] = {bad, ok, ok, ok, ok};
  const int math[] = {def, conv, def, tc, def};
  const size_t memory[] = {0, 0, 1000, 10, 0};
  // f32: the down-converting one and the one over the limit are skipped.
  EXPECT_EQ(detail::PickCudnnAlgo(status, math, memory, 5, 100, false), 3);
  // f16 data may use the converting algorithm.
  EXPECT_EQ(detail::PickCudnnAlgo(status, math, memory, 5, 100, true), 1);
  // A bigger workspace admits the faster algorithm 2.
  EXPECT_EQ(detail::PickCudnnAlgo(status, math, memory, 5, 1000, false), 2);
  // Only failures: none.
  EXPECT_EQ(detail::PickCudnnAlgo(status, math, memory, 1, 1000, true), -1);
  EXPECT_EQ(detail::PickCudnnAlgo(status, math, memory, 0, 1000, true), -1);
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
