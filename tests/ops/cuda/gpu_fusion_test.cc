// ReLU fusion on GPUs (Model's activation fusion on cuda devices): a relu
// that is a layer's only reader runs inside an add (any layout) or a
// channels-last batchnorm (our kernels, ops/cuda/batch_norm_kernels.h), and
// an add normalises a channels-last batchnorm that only it reads
// (Layer::FuseProducer: y = relu(bn(x) + z) in one pass). The
// kernels' grid is checked on the host in any build, and the host-side
// choice of which layers take the relu in any CUDA build; the
// fused models against the same models with every relu a layer of its own,
// on the same GPU, skip without one.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ops/cuda/channel_grid.h"
#include "ops/device_ops.h"
#include "ops/model.h"
#include "ops/registry.h"
#include "tests/ops/cuda/util.h"
#include "tests/ops/gpu_check.h"

namespace cnnflow::testing {
namespace {

// A ResNet block with a downsampling shortcut, and its stem: conv-BN-ReLU,
// conv-BN and conv-BN side by side, the residual add of the two BNs and its
// ReLU, then a BN-ReLU before global pooling.
std::vector<LayerSpec> BlockNet() {
  return {
      Spec("conv1", "conv2d",
           {{"out", int64_t{8}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}, {"bias", false}}),
      Spec("bn1", "batchnorm", {{"momentum", 0.3}}),
      Spec("relu1", "relu"),
      Spec("conv2", "conv2d",
           {{"out", int64_t{8}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}, {"bias", false}}),
      Spec("bn2", "batchnorm"),
      Spec("down", "conv2d", {{"out", int64_t{8}}, {"kernel", int64_t{1}}, {"bias", false}},
           {"relu1"}),
      Spec("down_bn", "batchnorm"),
      Spec("skip", "add", {}, {"bn2", "down_bn"}),
      Spec("relu2", "relu"),
      Spec("conv3", "conv2d",
           {{"out", int64_t{12}}, {"kernel", int64_t{3}}, {"stride", int64_t{2}}}),
      Spec("bn3", "batchnorm", {{"affine", false}}),
      Spec("relu3", "relu"),
      Spec("gap", "global_avgpool"),
      Spec("fc", "linear", {{"out", int64_t{5}}}),
  };
}

// The batchnorm kernels' grid, walked on the host as the GPU runs it:
// every value of an [n, c, s] tensor is visited once, by a thread of its
// own channel, in either layout; channel counts around the 32-wide tile,
// one position per sample, and shapes with more and fewer rows than strips.
TEST(ChannelGrid, VisitsEveryValueOnceInItsChannel) {
  struct Case {
    int64_t n, c, s;
  };
  for (const Case& k : {Case{2, 3, 5}, Case{4, 33, 7}, Case{64, 64, 1}, Case{3, 64, 300},
                        Case{256, 8, 16}, Case{1, 1, 1}, Case{5, 100, 49}}) {
    for (bool nhwc : {false, true}) {
      const cuda::ChannelGrid g = cuda::ChannelGrid::Of(k.n, k.c, k.s, nhwc);
      const std::string what = StrCat(k.n, "x", k.c, "x", k.s, nhwc ? " nhwc" : " nchw");
      ASSERT_GE(g.strips, 1u) << what;
      ASSERT_LE(g.strips, 1024u) << what;
      std::vector<int> visits(static_cast<size_t>(k.n * k.c * k.s), 0);
      for (unsigned bx = 0; bx < g.tiles; ++bx) {
        for (unsigned by = 0; by < g.strips; ++by) {
          for (unsigned ty = 0; ty < g.threads_y(); ++ty) {
            for (unsigned tx = 0; tx < g.threads_x(); ++tx) {
              const int64_t ch = g.Channel(bx, tx);
              if (ch >= k.c) continue;
              g.ForEach(ch, by, tx, ty, [&](int64_t at) {
                ASSERT_EQ(nhwc ? at % k.c : (at / k.s) % k.c, ch) << what << " at " << at;
                ++visits[static_cast<size_t>(at)];
              });
            }
          }
        }
      }
      for (size_t i = 0; i < visits.size(); ++i) ASSERT_EQ(visits[i], 1) << what << " at " << i;
    }
  }
}

#if defined(CNNFLOW_WITH_CUDA)
std::unique_ptr<Layer> CudaLayer(const std::string& type, const Shape& in, bool nhwc,
                                 Args args = {}) {
  const LayerRegistry& registry = LayerRegistry::Get();
  args.FillDefaults(registry.Find(type)->schema);
  std::unique_ptr<Layer> layer = registry.Find(type, kCudaVariant)->create("l", args);
  const int inputs = layer->num_inputs();
  layer->Build(std::vector<Shape>(inputs, in), DType::kF32);
  if (nhwc) layer->SetChannelsLast(std::vector<bool>(inputs, true), true);
  return layer;
}

TEST(GpuFusion, ReluTakenByAddAndChannelsLastBatchNormWhichAnAddFinishes) {
  const Shape in{8, 6, 6};
  EXPECT_TRUE(CudaLayer("add", in, false)->FuseRelu());
  EXPECT_TRUE(CudaLayer("add", in, true)->FuseRelu());
  EXPECT_TRUE(CudaLayer("batchnorm", in, true)->FuseRelu());
  // NCHW keeps cuDNN's BN, and the relu a layer.
  EXPECT_FALSE(CudaLayer("batchnorm", in, false)->FuseRelu());
  // The CPU layer takes a GELU too; the GPU one does not.
  EXPECT_FALSE(CudaLayer("batchnorm", in, true)->FuseGelu());
  // An add finishes one channels-last batchnorm of its inputs (the other
  // writes its output), none of an NCHW one.
  auto add = CudaLayer("add", in, true);
  EXPECT_TRUE(add->FuseProducer(0, *CudaLayer("batchnorm", in, true)));
  EXPECT_FALSE(add->FuseProducer(1, *CudaLayer("batchnorm", in, true)));
  EXPECT_FALSE(CudaLayer("add", in, false)->FuseProducer(0, *CudaLayer("batchnorm", in, false)));
  auto bn_relu = CudaLayer("batchnorm", in, true);
  ASSERT_TRUE(bn_relu->FuseRelu());
  EXPECT_FALSE(CudaLayer("add", in, true)->FuseProducer(0, *bn_relu));  // its reader is a relu
  EXPECT_FALSE(CudaLayer("add", in, true)->FuseProducer(0, *CudaLayer("add", in, true)));
  EXPECT_FALSE(CudaLayer("conv2d", in, true,
                         Spec("c", "conv2d", {{"out", int64_t{4}}, {"kernel", int64_t{3}}}).args)
                   ->FuseRelu());
}
#endif

// Which relus of BlockNet a GPU model runs inside another layer.
std::vector<std::string> FusedRelus(const Model& m) {
  std::vector<std::string> fused;
  for (int i = 0; i < m.num_layers(); ++i)
    if (m.fused_into(i) >= 0) fused.push_back(m.layer(i).name());
  return fused;
}

// The fused model against the unfused one on the same GPU, same weights and
// batch: output, input and parameter gradients, and the running statistics
// after one training forward (f32 with TF32 off: to f32 rounding; bf16:
// to its rounding, as our BN and cuDNN's round in other places), then the
// same in evaluation (cuDNN's inference and a ReLU in place).
TEST(GpuFusionGPU, FusedModelsEqualUnfusedOnes) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  SetGpuMath(kGpu, {.tf32 = false});
  const Shape sample{3, 10, 10};
  for (MemoryFormat layout : {MemoryFormat::kNchw, MemoryFormat::kChannelsLast}) {
    for (DType compute : {DType::kF32, DType::kBF16}) {
      for (bool training : {true, false}) {
        const std::string what =
            StrCat(DTypeName(compute), layout == MemoryFormat::kNchw ? " NCHW" : " NHWC",
                   training ? " training" : " evaluation");
        ModelOptions o{.seed = 4, .device = kGpu, .compute = compute, .memory_format = layout};
        auto fused = Model::Build(BlockNet(), sample, o);
        o.fuse_activations = false;
        auto plain = Model::Build(BlockNet(), sample, o);
        const std::vector<std::string> expected =
            layout == MemoryFormat::kNchw ? std::vector<std::string>{"relu2"}
                                          : std::vector<std::string>{"relu1", "relu2", "relu3"};
        EXPECT_EQ(FusedRelus(*fused), expected) << what;
        EXPECT_TRUE(FusedRelus(*plain).empty());
        // A mean far from 0 and a spread of signs, so every ReLU masks.
        const Tensor x = RandomTensor(sample.WithBatch(6), 11, -2, 3, DType::kF32).To(kGpu);
        ForwardContext ctx;
        ctx.training = training;
        const double tol = compute == DType::kF32 ? 1e-5 : 3e-2;
        ExpectGpuModelsAgree(*plain, *fused, x, ctx, ctx, compute, 12, tol, what);
      }
    }
  }
  SetGpuMath(kGpu, {});
}

// The fused channels-last model against the CPU's f64 model (which fuses the
// same relus on its own kernels): an independent reference for our BN.
TEST(GpuFusionGPU, FusedChannelsLastModelMatchesCpuF64) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  SetGpuMath(kGpu, {.tf32 = false});
  const Shape sample{3, 10, 10};
  auto cpu = Model::Build(BlockNet(), sample, {.dtype = DType::kF64, .seed = 4});
  auto gpu =
      Model::Build(BlockNet(), sample,
                   {.seed = 4, .device = kGpu, .memory_format = MemoryFormat::kChannelsLast});
  const Tensor x = RandomTensor(sample.WithBatch(6), 11, -2, 3, DType::kF64);
  ForwardContext ctx;
  ctx.training = true;
  const Tensor y_cpu = cpu->Forward(x, ctx).Clone();
  const Tensor y_gpu = gpu->Forward(x.Cast(DType::kF32).To(kGpu), ctx);
  EXPECT_LT(NormalisedError(y_cpu, y_gpu), 1e-5);
  const Tensor dy = RandomTensor(y_cpu.shape(), 12, -1, 1, DType::kF64);
  Tensor dx_cpu, dx_gpu;
  cpu->Backward(dy, {}, &dx_cpu);
  gpu->Backward(dy.Cast(DType::kF32).To(kGpu), {}, &dx_gpu);
  EXPECT_LT(NormalisedError(dx_cpu, dx_gpu), 1e-5);
  auto pc = cpu->NamedParameters(), pg = gpu->NamedParameters();
  for (size_t i = 0; i < pc.size(); ++i) {
    EXPECT_LT(NormalisedError(pc[i].param->grad, pg[i].param->grad), 1e-5) << pc[i].name;
  }
  SetGpuMath(kGpu, {});
}

}  // namespace
}  // namespace cnnflow::testing
