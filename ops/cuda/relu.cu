// relu on a GPU (ops/layers/relu.h; NaN -> 0 as the CPU), in f32 or, under mixed
// precision, f16/bf16 (exact in any type: it keeps x or 0).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>
#include <vector>

#include "ops/cuda/kernels.h"
#include "ops/cuda/map.cuh"
#include "ops/layers/relu.h"

namespace cnnflow {
namespace {

using namespace cuda;  // the shared map and checks (ops/cuda/map.cuh)

__device__ __forceinline__ float Relu(float v) {
  return v > 0.f ? v : 0.f;
}  // NaN -> 0, as the CPU
__device__ __forceinline__ float ReluGrad(float y, float g) { return y > 0.f ? g : 0.f; }

struct ReluForwardOp {
  const float* x;
  float* y;
  __device__ void Scalar(int64_t i) const { y[i] = Relu(x[i]); }
  __device__ void Vector(int64_t i) const {
    const float4 a = reinterpret_cast<const float4*>(x)[i];
    reinterpret_cast<float4*>(y)[i] = make_float4(Relu(a.x), Relu(a.y), Relu(a.z), Relu(a.w));
  }
};

struct ReluBackwardOp {
  const float* y;
  const float* dy;
  float* dx;
  __device__ void Scalar(int64_t i) const { dx[i] = ReluGrad(y[i], dy[i]); }
  __device__ void Vector(int64_t i) const {
    const float4 a = reinterpret_cast<const float4*>(y)[i];
    const float4 g = reinterpret_cast<const float4*>(dy)[i];
    reinterpret_cast<float4*>(dx)[i] =
        make_float4(ReluGrad(a.x, g.x), ReluGrad(a.y, g.y), ReluGrad(a.z, g.z), ReluGrad(a.w, g.w));
  }
};

// Half types: keeps x itself; NaN -> 0 as the CPU.
template <typename T>
struct ReluForwardT {
  const T* x;
  T* y;
  __device__ void Scalar(int64_t i) const { y[i] = ToFloat(x[i]) > 0.f ? x[i] : FromFloat<T>(0.f); }
  CNNFLOW_VECTOR_BY_SCALARS
};

template <typename T>
struct ReluBackwardT {
  const T* y;
  const T* dy;
  T* dx;
  __device__ void Scalar(int64_t i) const {
    dx[i] = ToFloat(y[i]) > 0.f ? dy[i] : FromFloat<T>(0.f);
  }
  CNNFLOW_VECTOR_BY_SCALARS
};

class CudaReluLayer : public ReluLayer {
 public:
  using ReluLayer::ReluLayer;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    const Tensor& in = *x[0];
    CheckGpuFloat(in, StrCat("relu '", name(), "' input"));
    CheckGpuFloat(y, StrCat("relu '", name(), "' output"));
    CheckSameGpu(in, y, StrCat("relu '", name(), "'"));
    CheckSameType(in, y, StrCat("relu '", name(), "'"));
    CNNFLOW_ENFORCE(in.numel() == y.numel(), "relu ", name(), ": ", in.shape(), " -> ", y.shape());
    cuda::Relu(in, y);
  }

  void Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    if (dx[0] == nullptr) return;
    CheckGpuFloat(dy, StrCat("relu '", name(), "' dy"));
    CheckGpuFloat(*dx[0], StrCat("relu '", name(), "' dx"));
    CheckSameType(y, dy, StrCat("relu '", name(), "' y and dy"));
    CheckSameType(dy, *dx[0], StrCat("relu '", name(), "' dy and dx"));
    CNNFLOW_ENFORCE(dy.numel() == y.numel() && dx[0]->numel() == y.numel(), "relu ", name(),
                    ": dy ", dy.shape(), " y ", y.shape());
    cuda::ReluBackward(y, dy, *dx[0]);
  }
};

}  // namespace

namespace cuda {

void Relu(const Tensor& x, Tensor& y) {
  CudaContext& c = CudaContext::For(x.device());
  if (x.dtype() == DType::kF32) {
    const float* xs = x.data<float>();
    float* ys = y.data<float>();
    LaunchMap(ReluForwardOp{xs, ys}, x.numel(), Aligned16(xs) && Aligned16(ys), c.stream());
    return;
  }
  DispatchGpuFloat(x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    LaunchMap(ReluForwardT<T>{static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data())},
              x.numel(), true, c.stream());
  });
}

void ReluBackward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  CudaContext& c = CudaContext::For(y.device());
  if (y.dtype() == DType::kF32) {
    const float* ys = y.data<float>();
    const float* g = dy.data<float>();
    float* d = dx.data<float>();
    LaunchMap(ReluBackwardOp{ys, g, d}, y.numel(), Aligned16(ys) && Aligned16(g) && Aligned16(d),
              c.stream());
    return;
  }
  DispatchGpuFloat(y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    LaunchMap(
        ReluBackwardT<T>{static_cast<const T*>(y.raw_data()), static_cast<const T*>(dy.raw_data()),
                         static_cast<T*>(dx.raw_data())},
        y.numel(), true, c.stream());
  });
}

}  // namespace cuda

CNNFLOW_REGISTER_CUDA_LAYER(relu, CudaReluLayer);

}  // namespace cnnflow
