// upsample on a GPU (ops/layers/upsample.h), simple kernels in f32 or, under
// mixed precision, f16/bf16 (blended in f32). The index maps are the CPU's
// (MakeResizeAxis<float>, PyTorch's rules), built on the host once and
// kept on the device:
//   forward   one thread per output cell: y = sum of its (up to) 4 taps
//   backward  one thread per input cell gathers from the outputs that read
//             it, [lo, hi) per axis, with the same tap weights: no two
//             threads write one cell, so no atomics and the same result
//             on every run
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstring>
#include <type_traits>
#include <vector>

#include "ops/cuda/map.cuh"
#include "ops/layers/upsample.h"

namespace cnnflow {
namespace {

using namespace cuda;

// Device pointers into the tables of one axis.
struct Axis {
  const int64_t *i0, *i1, *lo, *hi;
  const float* l1;
  int64_t in, out;
};

// The weight of input index h in output o along an axis.
__device__ __forceinline__ float Tap(const Axis& a, int64_t o, int64_t h) {
  const float l1 = a.l1[o];
  return (a.i0[o] == h ? 1.f - l1 : 0.f) + (a.i1[o] == h ? l1 : 0.f);
}

template <typename T>
__global__ void UpsampleForwardKernel(const T* x, T* y, int64_t total, Axis ah, Axis aw) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t p = i % aw.out, o = i / aw.out % ah.out, plane = i / (aw.out * ah.out);
    const T* xp = x + plane * ah.in * aw.in;
    const float bh = ah.l1[o], bw = aw.l1[p];
    const T* r0 = xp + ah.i0[o] * aw.in;
    const T* r1 = xp + ah.i1[o] * aw.in;
    const float top = (1.f - bw) * ToFloat(r0[aw.i0[p]]) + bw * ToFloat(r0[aw.i1[p]]);
    const float bottom = (1.f - bw) * ToFloat(r1[aw.i0[p]]) + bw * ToFloat(r1[aw.i1[p]]);
    y[i] = FromFloat<T>((1.f - bh) * top + bh * bottom);
  }
}

template <typename T>
__global__ void UpsampleBackwardKernel(const T* dy, T* dx, int64_t total, Axis ah, Axis aw) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t w = i % aw.in, h = i / aw.in % ah.in, plane = i / (aw.in * ah.in);
    const T* g = dy + plane * ah.out * aw.out;
    float s = 0.f;
    for (int64_t o = ah.lo[h]; o < ah.hi[h]; ++o) {
      const float th = Tap(ah, o, h);
      float row = 0.f;
      for (int64_t p = aw.lo[w]; p < aw.hi[w]; ++p)
        row += Tap(aw, p, w) * ToFloat(g[o * aw.out + p]);
      s += th * row;
    }
    dx[i] = FromFloat<T>(s);
  }
}

class CudaUpsample : public Upsample {
 public:
  using Upsample::Upsample;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext&) override {
    const Tensor& in = *x[0];
    Check(in, y, "input", "output");
    const int64_t total = in.dim(0) * channels() * out_h() * out_w();
    CNNFLOW_ENFORCE(y.numel() == total, "upsample '", name(), "': ", in.shape(), " -> ", y.shape());
    if (total == 0) return;
    Upload(in.device());
    CudaContext& c = CudaContext::For(in.device());
    DispatchGpuFloat(in.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      UpsampleForwardKernel<T><<<CudaBlocks(total), kCudaThreads, 0, c.stream()>>>(
          static_cast<const T*>(in.raw_data()), static_cast<T*>(y.raw_data()), total, h_, w_);
      CNNFLOW_CUDA_CHECK_LAUNCH();
    });
  }

  void Backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    if (dx.empty() || dx[0] == nullptr) return;
    Check(dy, *dx[0], "dy", "dx");
    const int64_t total = x[0]->dim(0) * channels() * in_h() * in_w();
    CNNFLOW_ENFORCE(dx[0]->numel() == total, "upsample '", name(), "': dx ", dx[0]->shape());
    if (total == 0) return;
    Upload(dy.device());
    CudaContext& c = CudaContext::For(dy.device());
    DispatchGpuFloat(dy.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      UpsampleBackwardKernel<T><<<CudaBlocks(total), kCudaThreads, 0, c.stream()>>>(
          static_cast<const T*>(dy.raw_data()), static_cast<T*>(dx[0]->raw_data()), total, h_, w_);
      CNNFLOW_CUDA_CHECK_LAUNCH();
    });
  }

 private:
  void Check(const Tensor& a, const Tensor& b, const char* an, const char* bn) const {
    CheckGpuFloat(a, StrCat("upsample '", name(), "' ", an));
    CheckGpuFloat(b, StrCat("upsample '", name(), "' ", bn));
    CheckSameGpu(a, b, StrCat("upsample '", name(), "'"));
    CheckSameType(a, b, StrCat("upsample '", name(), "'"));
  }

  // The index maps on `device` (once; the shapes are fixed by Build).
  void Upload(Device device) {
    if (ints_.defined() && ints_.device() == device) return;
    const ResizeAxis<float> ah =
        MakeResizeAxis<float>(in_h(), out_h(), scale_h(), bilinear(), align_corners());
    const ResizeAxis<float> aw =
        MakeResizeAxis<float>(in_w(), out_w(), scale_w(), bilinear(), align_corners());
    std::vector<int64_t> ints;
    std::vector<float> floats;
    for (const ResizeAxis<float>* a : {&ah, &aw}) {
      for (const std::vector<int64_t>* v : {&a->i0, &a->i1, &a->lo, &a->hi}) {
        ints.insert(ints.end(), v->begin(), v->end());
      }
      floats.insert(floats.end(), a->l1.begin(), a->l1.end());
    }
    Tensor hi = Tensor::Empty({static_cast<int64_t>(ints.size())}, DType::kI64);
    std::memcpy(hi.raw_data(), ints.data(), ints.size() * sizeof(int64_t));
    Tensor hf = Tensor::Empty({static_cast<int64_t>(floats.size())}, DType::kF32);
    std::memcpy(hf.raw_data(), floats.data(), floats.size() * sizeof(float));
    ints_ = hi.To(device);
    floats_ = hf.To(device);
    const int64_t* ip = static_cast<const int64_t*>(ints_.raw_data());
    const float* fp = static_cast<const float*>(floats_.raw_data());
    auto axis = [&](int64_t in, int64_t out) {
      Axis a{ip, ip + out, ip + 2 * out, ip + 2 * out + in, fp, in, out};
      ip += 2 * out + 2 * in;
      fp += out;
      return a;
    };
    h_ = axis(in_h(), out_h());
    w_ = axis(in_w(), out_w());
  }

  Tensor ints_, floats_;
  Axis h_{}, w_{};
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(upsample, CudaUpsample);

}  // namespace cnnflow
