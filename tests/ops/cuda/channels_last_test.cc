// Channels-last on GPUs (graph.channels_last: true on cuda devices): the
// layout kernel (cuda::ChangeLayout) against a host transpose, and whole
// models whose activations are stored NHWC against the CPU's f32 (NCHW),
// forward and every gradient, in f32 (TF32 off), bf16 and f16. The host-side check that names a
// layer without a channels-last GPU kernel (Model::GpuChannelsLastRefusal) runs in any CUDA build;
// the rest skips without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ops/device_ops.h"
#include "ops/model.h"
#include "tests/ops/cuda/util.h"
#include "tests/ops/gpu_check.h"

namespace cnnflow::testing {
namespace {

using Ints = std::vector<int64_t>;

// A residual block, max-pooling, a strided convolution, global pooling:
// every layer kind ResNets use, a skip connection (add) included, and the
// speed run's GELU and constant scale.
std::vector<LayerSpec> ResidualNet() {
  return {
      Spec("conv1", "conv2d", {{"out", int64_t{8}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Spec("bn1", "batchnorm"),
      Spec("relu1", "relu"),
      Spec("conv2", "conv2d",
           {{"out", int64_t{8}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}, {"bias", false}}),
      Spec("bn2", "batchnorm"),
      Spec("skip", "add", {}, {"bn2", "relu1"}),
      Spec("relu2", "relu"),
      Spec("pool", "maxpool2d", {{"kernel", int64_t{2}}}),
      Spec("down", "conv2d",
           {{"out", int64_t{16}}, {"kernel", int64_t{3}}, {"stride", int64_t{2}}}),
      Spec("gelu", "gelu"),
      Spec("scale", "mul", {{"scale", std::vector<double>{0.5}}}),  // the speed run's head scale
      Spec("gap", "global_avgpool"),
      Spec("fc", "linear", {{"out", int64_t{5}}}),
  };
}

// The speed run's tail: a pooled 2 x 2 plane flattened (in NCHW order) into
// a linear layer, and an average pool.
std::vector<LayerSpec> FlattenNet() {
  return {
      Spec("conv", "conv2d", {{"out", int64_t{6}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Spec("avg", "avgpool2d", {{"kernel", int64_t{2}}}),
      Spec("bn", "batchnorm"),
      Spec("pool", "maxpool2d", {{"kernel", int64_t{2}}}),
      Spec("flat", "flatten"),
      Spec("fc", "linear", {{"out", int64_t{4}}}),
  };
}

// How many of the model's activations are stored NHWC.
int NhwcOutputs(const Model& m) {
  int count = 0;
  for (int i = 0; i < m.num_layers(); ++i) count += m.layer(i).nhwc_output() ? 1 : 0;
  return count;
}

// Every figure of c below tol (the buffers too when `buffers`).
void ExpectWithin(const GpuCpuComparison& c, double tol, const std::string& what,
                  bool buffers = true) {
  EXPECT_LT(c.output, tol) << what << ": " << Describe(c);
  EXPECT_LT(c.input_grad, tol) << what << ": " << Describe(c);
  EXPECT_LT(c.param_grad, tol) << what << ": " << Describe(c);
  if (buffers) EXPECT_LT(c.buffer, tol) << what << ": " << Describe(c);
}

// Full f32 on the GPU for the tests that compare to 1e-5, restored after.
class NoTf32 {
 public:
  NoTf32() { SetGpuMath(kGpu, {.tf32 = false}); }
  ~NoTf32() { SetGpuMath(kGpu, {}); }
};

#if defined(CNNFLOW_WITH_CUDA)
TEST(ChannelsLastGpuConfig, NamesTheFirstLayerWithoutAKernel) {
  EXPECT_EQ(Model::GpuChannelsLastRefusal(ResidualNet(), Shape{3, 12, 12}), "");
  EXPECT_EQ(Model::GpuChannelsLastRefusal(FlattenNet(), Shape{2, 8, 8}), "");
  std::vector<LayerSpec> with_upsample = ResidualNet();
  with_upsample.insert(with_upsample.begin() + 7, Spec("up", "upsample", {{"scale", 2.0}}));
  const std::string why = Model::GpuChannelsLastRefusal(with_upsample, Shape{3, 12, 12});
  EXPECT_NE(why.find("'up' (upsample)"), std::string::npos) << why;
  EXPECT_NE(why.find("channels-last"), std::string::npos) << why;
  // A ceil_mode pooling whose last window hangs over: NCHW kernels only.
  const std::string ceil = Model::GpuChannelsLastRefusal(
      {Spec("c", "conv2d", {{"out", int64_t{4}}, {"kernel", int64_t{3}}}),
       Spec("p", "maxpool2d", {{"kernel", int64_t{2}}, {"ceil_mode", true}}), Spec("f", "flatten")},
      Shape{1, 9, 9});  // a 7 x 7 plane: 4 windows of 2, the last hanging over
  EXPECT_NE(ceil.find("'p' (maxpool2d)"), std::string::npos) << ceil;
  // 1-D models have no 4-D activations: nothing to refuse.
  EXPECT_EQ(Model::GpuChannelsLastRefusal(
                {Spec("c", "conv1d", {{"out", int64_t{4}}, {"kernel", int64_t{3}}}),
                 Spec("g", "global_avgpool"), Spec("fc", "linear", {{"out", int64_t{2}}})},
                Shape{2, 16}),
            "");
}
#endif

TEST(ChangeLayoutGPU, TransposesConvertsAndAccumulates) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // Sizes around the 32 x 32 tile: partial tiles on both sides.
  const int64_t n = 3, c = 37, h = 5, w = 9;
  const Tensor x = RandomTensor(Shape{n, c, h, w}, 7, -2, 2, DType::kF32);
  auto nchw_at = [&](int64_t b, int64_t ch, int64_t p) { return x.At((b * c + ch) * h * w + p); };
  Tensor nhwc = Tensor::Empty(x.shape(), DType::kF32, kGpu);
  cuda::ChangeLayout(x.To(kGpu), nhwc, /*to_nhwc=*/true);
  const Tensor got = nhwc.To(Device::Cpu());
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t p = 0; p < h * w; ++p) {
      for (int64_t ch = 0; ch < c; ++ch) {
        ASSERT_EQ(got.At((b * h * w + p) * c + ch), nchw_at(b, ch, p))
            << b << " " << p << " " << ch;
      }
    }
  }
  // Back, in bf16: the values rounded to nearest even, in NCHW order.
  Tensor back = Tensor::Empty(x.shape(), DType::kBF16, kGpu);
  cuda::ChangeLayout(nhwc, back, /*to_nhwc=*/false);
  const Tensor back32 = ToF32(back).To(Device::Cpu());
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(back32.At(i), HostFromBf16(HostToBf16(static_cast<float>(x.At(i))))) << i;
  }
  // Accumulating: dst += the transposed source.
  Tensor sum = x.To(kGpu);
  cuda::ChangeLayout(nhwc, sum, /*to_nhwc=*/false, /*accumulate=*/true);
  const Tensor sum_host = sum.To(Device::Cpu());
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(sum_host.At(i), 2 * x.At(i)) << i;
}

// f32, TF32 off: the NHWC model equals the CPU's f32 (NCHW) to f32
// rounding (cuDNN's NHWC kernels sum in other orders).
TEST(ChannelsLastGPU, ResidualNetMatchesCpuAndNchwInF32) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  NoTf32 full_f32;
  const auto nhwc = CompareWithCpu(ResidualNet(), Shape{3, 12, 12}, 4, true, 5, DType::kF32,
                                   MemoryFormat::kChannelsLast);
  ExpectWithin(nhwc, 1e-5, "training");
  const auto eval = CompareWithCpu(ResidualNet(), Shape{3, 12, 12}, 4, false, 6, DType::kF32,
                                   MemoryFormat::kChannelsLast);
  ExpectWithin(eval, 1e-5, "evaluation");
  // The layout really changed: every activation but the model's output and
  // those after global pooling is NHWC.
  auto m = Model::Build(ResidualNet(), Shape{3, 12, 12},
                        {.device = kGpu, .memory_format = MemoryFormat::kChannelsLast});
  EXPECT_EQ(NhwcOutputs(*m), 11);
  auto plain = Model::Build(ResidualNet(), Shape{3, 12, 12}, {.device = kGpu});
  EXPECT_EQ(NhwcOutputs(*plain), 0);
}

TEST(ChannelsLastGPU, FlattenAndAvgPoolMatchCpuInF32) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  NoTf32 full_f32;
  const auto c = CompareWithCpu(FlattenNet(), Shape{2, 8, 8}, 5, true, 9, DType::kF32,
                                MemoryFormat::kChannelsLast);
  ExpectWithin(c, 1e-5, "f32");
  auto m = Model::Build(FlattenNet(), Shape{2, 8, 8},
                        {.device = kGpu, .memory_format = MemoryFormat::kChannelsLast});
  EXPECT_EQ(NhwcOutputs(*m), 4);  // conv, avg, bn, pool; flatten writes NCHW order
}

// Mixed precision: the NHWC model in bf16 and f16 against the CPU's f32,
// within the half types' rounding (as every layer's mixed-precision test).
TEST(ChannelsLastGPU, ResidualNetInHalfPrecisionMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  for (DType compute : {DType::kBF16, DType::kF16}) {
    const double tol = compute == DType::kBF16 ? 5e-2 : 1e-2;
    const auto c = CompareWithCpu(ResidualNet(), Shape{3, 12, 12}, 4, true, 5, compute,
                                  MemoryFormat::kChannelsLast);
    ExpectWithin(c, tol, DTypeName(compute), /*buffers=*/false);
  }
}

// A model input read by a convolution that writes NHWC, whose input
// gradient comes back NCHW (the first layer's conversion both ways).
TEST(ChannelsLastGPU, InputGradientOfTheFirstConvolutionIsNchw) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  NoTf32 full_f32;
  const std::vector<LayerSpec> specs = {
      Spec("c", "conv2d", {{"out", int64_t{5}}, {"kernel", int64_t{3}}, {"stride", Ints{2, 1}}}),
      Spec("r", "relu"), Spec("c2", "conv2d", {{"out", int64_t{3}}, {"kernel", int64_t{1}}})};
  const auto c =
      CompareWithCpu(specs, Shape{4, 9, 7}, 3, true, 4, DType::kF32, MemoryFormat::kChannelsLast);
  ExpectWithin(c, 1e-5, "f32");
}

}  // namespace
}  // namespace cnnflow::testing
