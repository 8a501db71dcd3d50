// conv_transpose2d on a GPU (ops/layers/conv_transpose2d.h): simple direct
// kernels in f32, each written as a gather so that no two threads write
// one element (deterministic, no atomics):
//   forward           one thread per output cell: bias + the taps whose
//                     input cell lands on it (ih = (oh + pad - i*dil) / stride
//                     when that divides)
//   backward-data     one thread per input cell: the dual convolution's
//                     forward (oh = ih*stride - pad + i*dil)
//   backward-weights  one block per weight element, a fixed-order block
//                     reduction over the batch and the input plane
//   bias              one block per output channel, likewise
// Why not cuDNN: conv_cudnn.cc's CudnnConv couples its passes in one
// Forward/Backward pair behind an anonymous namespace; these kernels are
// small and the layer is rare in the model library. A cuDNN path (the
// dual's backward-data / forward / backward-filter) is the faster later step.
#include <cuda_runtime.h>

#include <vector>

#include "ops/cuda/map.cuh"
#include "ops/layers/conv_transpose2d.h"

namespace cnnflow {
namespace {

using namespace cuda;

// The layer's shapes: input [n, c, h, w] -> output [n, k, oh, ow].
struct Geo {
  int64_t c, h, w, k, oh, ow;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw, groups;
  __host__ __device__ int64_t cg() const { return c / groups; }
  __host__ __device__ int64_t kg() const { return k / groups; }
};

__global__ void ConvTForwardKernel(const float* x, const float* wt, const float* bias, float* y,
                                   int64_t total, Geo g) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += stride) {
    const int64_t ox = idx % g.ow, oy = idx / g.ow % g.oh, k = idx / (g.ow * g.oh) % g.k;
    const int64_t n = idx / (g.ow * g.oh * g.k);
    const int64_t grp = k / g.kg(), kk = k % g.kg();
    float s = bias != nullptr ? bias[k] : 0.f;
    for (int64_t cc = 0; cc < g.cg(); ++cc) {
      const int64_t c = grp * g.cg() + cc;
      const float* xc = x + (n * g.c + c) * g.h * g.w;
      const float* wc = wt + (c * g.kg() + kk) * g.kh * g.kw;
      for (int64_t i = 0; i < g.kh; ++i) {
        const int64_t ty = oy + g.ph - i * g.dh;
        if (ty < 0 || ty % g.sh != 0 || ty / g.sh >= g.h) continue;
        const int64_t iy = ty / g.sh;
        for (int64_t j = 0; j < g.kw; ++j) {
          const int64_t tx = ox + g.pw - j * g.dw;
          if (tx < 0 || tx % g.sw != 0 || tx / g.sw >= g.w) continue;
          s += xc[iy * g.w + tx / g.sw] * wc[i * g.kw + j];
        }
      }
    }
    y[idx] = s;
  }
}

__global__ void ConvTBackwardDataKernel(const float* dy, const float* wt, float* dx, int64_t total,
                                        Geo g) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += stride) {
    const int64_t ix = idx % g.w, iy = idx / g.w % g.h, c = idx / (g.w * g.h) % g.c;
    const int64_t n = idx / (g.w * g.h * g.c);
    const int64_t grp = c / g.cg();
    float s = 0.f;
    for (int64_t kk = 0; kk < g.kg(); ++kk) {
      const float* gk = dy + (n * g.k + grp * g.kg() + kk) * g.oh * g.ow;
      const float* wc = wt + (c * g.kg() + kk) * g.kh * g.kw;
      for (int64_t i = 0; i < g.kh; ++i) {
        const int64_t oy = iy * g.sh - g.ph + i * g.dh;
        if (oy < 0 || oy >= g.oh) continue;
        for (int64_t j = 0; j < g.kw; ++j) {
          const int64_t ox = ix * g.sw - g.pw + j * g.dw;
          if (ox < 0 || ox >= g.ow) continue;
          s += gk[oy * g.ow + ox] * wc[i * g.kw + j];
        }
      }
    }
    dx[idx] = s;
  }
}

// Sums v over the block in a fixed order; thread 0 gets the total.
__device__ float BlockSum(float v) {
  __shared__ float buf[kCudaThreads];
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int half = kCudaThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) buf[threadIdx.x] += buf[threadIdx.x + half];
    __syncthreads();
  }
  return buf[0];
}

// Block b: weight element b = ((c * kg + kk) * kh + i) * kw + j; adds into dw.
__global__ void ConvTBackwardWeightsKernel(const float* x, const float* dy, float* dw, int64_t n,
                                           Geo g) {
  const int64_t b = blockIdx.x;
  const int64_t j = b % g.kw, i = b / g.kw % g.kh, kk = b / (g.kw * g.kh) % g.kg();
  const int64_t c = b / (g.kw * g.kh * g.kg());
  const int64_t k = c / g.cg() * g.kg() + kk;
  const int64_t plane = g.h * g.w, count = n * plane;
  float s = 0.f;
  for (int64_t t = threadIdx.x; t < count; t += blockDim.x) {
    const int64_t s_n = t / plane, iy = t % plane / g.w, ix = t % g.w;
    const int64_t oy = iy * g.sh - g.ph + i * g.dh, ox = ix * g.sw - g.pw + j * g.dw;
    if (oy < 0 || oy >= g.oh || ox < 0 || ox >= g.ow) continue;
    s += x[(s_n * g.c + c) * plane + iy * g.w + ix] * dy[((s_n * g.k + k) * g.oh + oy) * g.ow + ox];
  }
  s = BlockSum(s);
  if (threadIdx.x == 0) dw[b] += s;
}

// Block k: db[k] += the sum of dy[:, k].
__global__ void ConvTBiasKernel(const float* dy, float* db, int64_t n, Geo g) {
  const int64_t k = blockIdx.x, plane = g.oh * g.ow;
  float s = 0.f;
  for (int64_t t = threadIdx.x; t < n * plane; t += blockDim.x) {
    s += dy[(t / plane * g.k + k) * plane + t % plane];
  }
  s = BlockSum(s);
  if (threadIdx.x == 0) db[k] += s;
}

class CudaConvTranspose2d : public ConvTranspose2d {
 public:
  using ConvTranspose2d::ConvTranspose2d;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext&) override {
    const Tensor& in = *x[0];
    CheckGpuF32(in, StrCat("conv_transpose2d '", name(), "' input"));
    CheckGpuF32(y, StrCat("conv_transpose2d '", name(), "' output"));
    CheckSameGpu(in, y, StrCat("conv_transpose2d '", name(), "'"));
    const Geo g = Geometry();
    const int64_t total = in.dim(0) * g.k * g.oh * g.ow;
    CNNFLOW_ENFORCE(y.numel() == total && in.numel() == in.dim(0) * g.c * g.h * g.w,
                    "conv_transpose2d '", name(), "': ", in.shape(), " -> ", y.shape());
    if (total == 0) return;
    CudaContext& c = CudaContext::For(in.device());
    const float* bias = has_bias_ ? parameters()[1].value.data<float>() : nullptr;
    ConvTForwardKernel<<<CudaBlocks(total), kCudaThreads, 0, c.stream()>>>(
        in.data<float>(), parameters()[0].value.data<float>(), bias, y.data<float>(), total, g);
    CNNFLOW_CUDA_CHECK_LAUNCH();
  }

  void Backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    const Tensor& in = *x[0];
    CheckGpuF32(dy, StrCat("conv_transpose2d '", name(), "' dy"));
    const Geo g = Geometry();
    const int64_t n = in.dim(0);
    CudaContext& c = CudaContext::For(dy.device());
    if (n == 0) return;
    if (!dx.empty() && dx[0] != nullptr) {
      CheckGpuF32(*dx[0], StrCat("conv_transpose2d '", name(), "' dx"));
      const int64_t total = n * g.c * g.h * g.w;
      ConvTBackwardDataKernel<<<CudaBlocks(total), kCudaThreads, 0, c.stream()>>>(
          dy.data<float>(), parameters()[0].value.data<float>(), dx[0]->data<float>(), total, g);
      CNNFLOW_CUDA_CHECK_LAUNCH();
    }
    const unsigned weights = static_cast<unsigned>(parameters()[0].value.numel());
    ConvTBackwardWeightsKernel<<<weights, kCudaThreads, 0, c.stream()>>>(
        in.data<float>(), dy.data<float>(), parameters()[0].grad.data<float>(), n, g);
    CNNFLOW_CUDA_CHECK_LAUNCH();
    if (has_bias_) {
      ConvTBiasKernel<<<static_cast<unsigned>(g.k), kCudaThreads, 0, c.stream()>>>(
          dy.data<float>(), parameters()[1].grad.data<float>(), n, g);
      CNNFLOW_CUDA_CHECK_LAUNCH();
    }
  }

 private:
  Geo Geometry() const {
    const Conv2dGeometry& d = dual_;
    return {d.out_channels, d.out_h,    d.out_w,      d.in_channels, d.in_h,
            d.in_w,         d.kernel_h, d.kernel_w,   d.stride_h,    d.stride_w,
            d.pad_h,        d.pad_w,    d.dilation_h, d.dilation_w,  d.groups};
  }
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(conv_transpose2d, CudaConvTranspose2d);

}  // namespace cnnflow
