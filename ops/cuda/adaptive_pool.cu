// adaptive_avgpool2d / adaptive_avgpool1d on a GPU (ops/layers/adaptive_pool.h),
// simple kernels in f32 or, under mixed precision, f16/bf16 (summed in f32):
//   forward   one thread per output cell sums its window
//   backward  one thread per input cell gathers from the windows that hold
//             it, rows [floor(h*m/n), ceil((h+1)*m/n)) of the outputs (the
//             inverse of AdaptiveStart/End), so no two threads write one
//             cell: deterministic, no atomics
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>
#include <vector>

#include "ops/cuda/map.cuh"
#include "ops/layers/adaptive_pool.h"

namespace cnnflow {
namespace {

using namespace cuda;

__device__ __forceinline__ int64_t Start(int64_t i, int64_t in, int64_t out) {
  return i * in / out;
}
__device__ __forceinline__ int64_t End(int64_t i, int64_t in, int64_t out) {
  return ((i + 1) * in + out - 1) / out;
}

struct Geo {
  int64_t in_h, in_w, out_h, out_w;
};

template <typename T>
__global__ void AdaptiveForwardKernel(const T* x, T* y, int64_t total, Geo g) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t ow = i % g.out_w, oh = i / g.out_w % g.out_h, p = i / (g.out_w * g.out_h);
    const int64_t hs = Start(oh, g.in_h, g.out_h), he = End(oh, g.in_h, g.out_h);
    const int64_t ws = Start(ow, g.in_w, g.out_w), we = End(ow, g.in_w, g.out_w);
    const T* xp = x + p * g.in_h * g.in_w;
    float s = 0.f;
    for (int64_t h = hs; h < he; ++h) {
      for (int64_t w = ws; w < we; ++w) s += ToFloat(xp[h * g.in_w + w]);
    }
    y[i] = FromFloat<T>(s / static_cast<float>((he - hs) * (we - ws)));
  }
}

template <typename T>
__global__ void AdaptiveBackwardKernel(const T* dy, T* dx, int64_t total, Geo g) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t w = i % g.in_w, h = i / g.in_w % g.in_h, p = i / (g.in_w * g.in_h);
    const int64_t oh0 = h * g.out_h / g.in_h, oh1 = ((h + 1) * g.out_h + g.in_h - 1) / g.in_h;
    const int64_t ow0 = w * g.out_w / g.in_w, ow1 = ((w + 1) * g.out_w + g.in_w - 1) / g.in_w;
    const T* g_p = dy + p * g.out_h * g.out_w;
    float s = 0.f;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const int64_t rows = End(oh, g.in_h, g.out_h) - Start(oh, g.in_h, g.out_h);
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t cols = End(ow, g.in_w, g.out_w) - Start(ow, g.in_w, g.out_w);
        s += ToFloat(g_p[oh * g.out_w + ow]) / static_cast<float>(rows * cols);
      }
    }
    dx[i] = FromFloat<T>(s);
  }
}

class CudaAdaptiveAvgPool : public AdaptiveAvgPool {
 public:
  using AdaptiveAvgPool::AdaptiveAvgPool;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext&) override {
    const Tensor& in = *x[0];
    Check(in, y, "input", "output");
    const int64_t total = in.dim(0) * geometry().channels * geometry().out_plane();
    CNNFLOW_ENFORCE(y.numel() == total, type(), " '", name(), "': ", in.shape(), " -> ", y.shape());
    if (total == 0) return;
    CudaContext& c = CudaContext::For(in.device());
    DispatchGpuFloat(in.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      AdaptiveForwardKernel<T><<<CudaBlocks(total), kCudaThreads, 0, c.stream()>>>(
          static_cast<const T*>(in.raw_data()), static_cast<T*>(y.raw_data()), total, Geometry());
      CNNFLOW_CUDA_CHECK_LAUNCH();
    });
  }

  void Backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    if (dx.empty() || dx[0] == nullptr) return;
    Check(dy, *dx[0], "dy", "dx");
    const int64_t total = x[0]->dim(0) * geometry().channels * geometry().in_plane();
    CNNFLOW_ENFORCE(dx[0]->numel() == total, type(), " '", name(), "': dx ", dx[0]->shape());
    if (total == 0) return;
    CudaContext& c = CudaContext::For(dy.device());
    DispatchGpuFloat(dy.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      AdaptiveBackwardKernel<T><<<CudaBlocks(total), kCudaThreads, 0, c.stream()>>>(
          static_cast<const T*>(dy.raw_data()), static_cast<T*>(dx[0]->raw_data()), total,
          Geometry());
      CNNFLOW_CUDA_CHECK_LAUNCH();
    });
  }

 private:
  Geo Geometry() const {
    const AdaptivePoolGeometry& g = geometry();
    return {g.in_h, g.in_w, g.out_h, g.out_w};
  }
  void Check(const Tensor& a, const Tensor& b, const char* an, const char* bn) const {
    CheckGpuFloat(a, StrCat(type(), " '", name(), "' ", an));
    CheckGpuFloat(b, StrCat(type(), " '", name(), "' ", bn));
    CheckSameGpu(a, b, StrCat(type(), " '", name(), "'"));
    CheckSameType(a, b, StrCat(type(), " '", name(), "'"));
  }
};

class CudaAdaptiveAvgPool2d : public CudaAdaptiveAvgPool {
 public:
  CudaAdaptiveAvgPool2d(const std::string& name, const Args& args)
      : CudaAdaptiveAvgPool(name, args, 3) {}
};
class CudaAdaptiveAvgPool1d : public CudaAdaptiveAvgPool {
 public:
  CudaAdaptiveAvgPool1d(const std::string& name, const Args& args)
      : CudaAdaptiveAvgPool(name, args, 2) {}
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(adaptive_avgpool2d, CudaAdaptiveAvgPool2d);
CNNFLOW_REGISTER_CUDA_LAYER(adaptive_avgpool1d, CudaAdaptiveAvgPool1d);

}  // namespace cnnflow
