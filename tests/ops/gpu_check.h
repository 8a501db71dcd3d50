// GPU against CPU: runs the same small model on the CPU and on cuda:0 (same
// seed, so the same parameters; the same input and output gradient) and
// reports normalised errors of the output, the input gradient, every
// parameter gradient and every buffer, for the GPU tests of each layer.
// GPU tests carry GPU in their names and skip without one.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/cuda/kernels.h"
#include "ops/device.h"
#include "ops/model.h"
#include "tests/ops/gradient_check.h"
#include "tests/testing/helpers.h"

#define CNNFLOW_SKIP_WITHOUT_GPU()                                                        \
  do {                                                                                    \
    if (!::cnnflow::CudaAvailable()) {                                                    \
      GTEST_SKIP() << "no GPU found (" << ::cnnflow::CudaDeviceCount() << " CUDA devices" \
                   << "): GPU test skipped";                                              \
    }                                                                                     \
  } while (0)

namespace cnnflow::testing {

// max |gpu - cpu| / max(max |cpu|, 1e-6): scale-free, so one threshold per
// layer fits any input size.
inline double NormalisedError(const Tensor& cpu, const Tensor& gpu) {
  const Tensor g = gpu.To(Device::Cpu());
  EXPECT_EQ(cpu.shape(), g.shape());
  double diff = 0, scale = 1e-6;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    diff = std::max(diff, std::abs(cpu.At(i) - g.At(i)));
    scale = std::max(scale, std::abs(cpu.At(i)));
  }
  return diff / scale;
}

// An f32 copy of a GPU tensor of any float type.
inline Tensor ToF32(const Tensor& t) {
  if (t.dtype() == DType::kF32) return t.Clone();
  Tensor f = Tensor::Empty(t.shape(), DType::kF32, t.device());
  cuda::Cast(t, f);
  return f;
}

struct GpuCpuComparison {
  double output = 0;      // normalised error of the model's output
  double input_grad = 0;  // of the gradient with respect to the input
  double param_grad = 0;  // largest over the parameters
  double buffer = 0;      // largest over the buffers (BN running statistics)
  std::string worst_param;
};

// Forward (training or eval) and backward of `specs` on a batch of n samples
// of `sample_shape`, on the CPU in f32 and on cuda:0 computing in `compute`
// (f32, or f16/bf16 with f32 parameters: mixed precision), its activations
// stored as `layout` says (the CPU's stay NCHW).
inline GpuCpuComparison CompareWithCpu(const std::vector<LayerSpec>& specs,
                                       const Shape& sample_shape, int64_t n, bool training = true,
                                       uint64_t seed = 5, DType compute = DType::kF32,
                                       MemoryFormat layout = MemoryFormat::kNchw) {
  auto cpu =
      Model::Build(specs, sample_shape, {.seed = seed, .memory_format = MemoryFormat::kNchw});
  auto gpu = Model::Build(
      specs, sample_shape,
      {.seed = seed, .device = Device::Cuda(0), .compute = compute, .memory_format = layout});
  const Tensor x = RandomTensor(sample_shape.WithBatch(n), seed + 1, -1, 1, DType::kF32);
  ForwardContext ctx;
  ctx.training = training;
  ctx.seed = seed;
  ctx.step = 3;
  const Tensor y_cpu = cpu->Forward(x, ctx).Clone();
  const Tensor y_gpu = ToF32(gpu->Forward(x.To(Device::Cuda(0)), ctx));
  const Tensor dy = RandomTensor(y_cpu.shape(), seed + 2, -1, 1, DType::kF32);
  Tensor dx_cpu, dx_gpu;
  cpu->Backward(dy, {}, &dx_cpu);
  Tensor dy_gpu = dy.To(Device::Cuda(0));
  if (compute != DType::kF32) {
    Tensor half = Tensor::Empty(dy.shape(), compute, Device::Cuda(0));
    cuda::Cast(dy_gpu, half);
    dy_gpu = half;
  }
  gpu->Backward(dy_gpu, {}, &dx_gpu);
  dx_gpu = ToF32(dx_gpu);

  GpuCpuComparison c;
  c.output = NormalisedError(y_cpu, y_gpu);
  c.input_grad = NormalisedError(dx_cpu, dx_gpu);
  auto pc = cpu->NamedParameters();
  auto pg = gpu->NamedParameters();
  for (size_t i = 0; i < pc.size(); ++i) {
    EXPECT_EQ(pg[i].param->value.device(), Device::Cuda(0)) << pc[i].name;
    const double e = NormalisedError(pc[i].param->grad, pg[i].param->grad);
    if (e >= c.param_grad) {
      c.param_grad = e;
      c.worst_param = pc[i].name;
    }
  }
  auto sc = cpu->StateTensors();
  auto sg = gpu->StateTensors();
  for (size_t i = 0; i < sc.size(); ++i)
    c.buffer = std::max(c.buffer, NormalisedError(sc[i].second, sg[i].second));
  return c;
}

// Two GPU models of the same layers and weights, `ref` and `got`, on one
// batch x (each with its forward context), the same dy (seeded, in
// `compute`) into both: the output, the input gradient and every parameter
// gradient of `got` within tol of `ref`'s, its state tensors (BN's running
// statistics) within 1e-5.
inline void ExpectGpuModelsAgree(Model& ref, Model& got, const Tensor& x,
                                 const ForwardContext& ref_ctx, const ForwardContext& got_ctx,
                                 DType compute, uint64_t dy_seed, double tol,
                                 const std::string& what) {
  const Tensor y0 = ToF32(ref.Forward(x, ref_ctx)).To(Device::Cpu());
  const Tensor y1 = ToF32(got.Forward(x, got_ctx));
  EXPECT_LT(NormalisedError(y0, y1), tol) << what;
  Tensor dy = RandomTensor(y0.shape(), dy_seed, -1, 1, DType::kF32).To(x.device());
  if (compute != DType::kF32) {
    Tensor h = Tensor::Empty(dy.shape(), compute, x.device());
    cuda::Cast(dy, h);
    dy = h;
  }
  Tensor dx0, dx1;
  ref.Backward(dy, {}, &dx0);
  got.Backward(dy, {}, &dx1);
  EXPECT_LT(NormalisedError(ToF32(dx0).To(Device::Cpu()), ToF32(dx1)), tol) << what;
  auto p0 = ref.NamedParameters(), p1 = got.NamedParameters();
  ASSERT_EQ(p0.size(), p1.size()) << what;
  for (size_t i = 0; i < p0.size(); ++i) {
    EXPECT_LT(NormalisedError(p0[i].param->grad.To(Device::Cpu()), p1[i].param->grad), tol)
        << what << " " << p0[i].name;
  }
  auto s0 = ref.StateTensors(), s1 = got.StateTensors();
  for (size_t i = 0; i < s0.size(); ++i) {
    EXPECT_LT(NormalisedError(s0[i].second.To(Device::Cpu()), s1[i].second), 1e-5)
        << what << " " << s0[i].first;
  }
}

}  // namespace cnnflow::testing
