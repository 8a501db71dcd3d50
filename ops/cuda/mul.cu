// mul on a GPU (ops/layers/mul.h): the broadcast product of two inputs (f32)
// or a constant scale (f32, or f16/bf16 under mixed precision: computed in
// f32, rounded once); ds sums dy x over the broadcast dimensions, one block
// per element of s (ops/cuda/broadcast_mul.cuh).
#include <cuda_runtime.h>

#include <type_traits>
#include <vector>

#include "ops/cuda/broadcast_mul.cuh"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/map.cuh"
#include "ops/layers/mul.h"

namespace cnnflow {
namespace {

using namespace cuda;

struct ScaleOp {
  const float* x;
  float* y;
  float a;
  __device__ void Scalar(int64_t i) const { y[i] = a * x[i]; }
  __device__ void Vector(int64_t i) const {
    const float4 v = reinterpret_cast<const float4*>(x)[i];
    reinterpret_cast<float4*>(y)[i] = make_float4(a * v.x, a * v.y, a * v.z, a * v.w);
  }
};

template <typename T>
struct ScaleT {
  const T* x;
  T* y;
  float a;
  __device__ void Scalar(int64_t i) const { y[i] = FromFloat<T>(a * ToFloat(x[i])); }
  CNNFLOW_VECTOR_BY_SCALARS
};

// y = a * x, any float type (the same for both).
void ScaleInto(const Tensor& x, Tensor& y, double a, cudaStream_t stream) {
  if (x.dtype() == DType::kF32) {
    const float* xs = x.data<float>();
    float* ys = y.data<float>();
    LaunchMap(ScaleOp{xs, ys, static_cast<float>(a)}, x.numel(), Aligned16(xs) && Aligned16(ys),
              stream);
    return;
  }
  DispatchGpuFloat(x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    LaunchMap(ScaleT<T>{static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()),
                        static_cast<float>(a)},
              x.numel(), true, stream);
  });
}

class CudaMulLayer : public MulLayer {
 public:
  using MulLayer::MulLayer;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    const Tensor& in = *x[0];
    const int64_t n = in.dim(0);
    CNNFLOW_ENFORCE(in.numel() == n * factor_size() * repeat() && y.numel() == in.numel(), "mul ",
                    name(), ": ", in.shape(), " -> ", y.shape());
    CudaContext& c = CudaContext::For(in.device());
    if (has_scale()) {
      CheckGpuFloat(in, StrCat("mul '", name(), "' x"));
      CheckSameType(in, y, StrCat("mul '", name(), "' x and output"));
      ScaleInto(in, y, scale(), c.stream());
      return;
    }
    CheckGpuF32(in, StrCat("mul '", name(), "' x"));
    CheckGpuF32(y, StrCat("mul '", name(), "' output"));
    const Tensor& s = *x[1];
    CheckGpuF32(s, StrCat("mul '", name(), "' s"));
    CNNFLOW_ENFORCE(s.numel() == n * factor_size(), "mul ", name(), ": s ", s.shape());
    BroadcastMul(in.data<float>(), s.data<float>(), factor_size(), y.data<float>(), n,
                 factor_size(), repeat(), c.stream());
  }

  void Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    const int64_t n = dy.dim(0);
    CudaContext& c = CudaContext::For(dy.device());
    if (has_scale()) {
      if (dx[0] == nullptr) return;
      CheckGpuFloat(dy, StrCat("mul '", name(), "' dy"));
      CheckSameType(dy, *dx[0], StrCat("mul '", name(), "' dy and dx"));
      ScaleInto(dy, *dx[0], scale(), c.stream());
      return;
    }
    CheckGpuF32(dy, StrCat("mul '", name(), "' dy"));
    for (Tensor* d : dx) {
      if (d != nullptr) CheckGpuF32(*d, StrCat("mul '", name(), "' dx"));
    }
    if (dx[1] != nullptr) {
      RowDots(dy.data<float>(), x[0]->data<float>(), dx[1]->data<float>(), n * factor_size(),
              repeat(), 1, 0, false, c.stream());
    }
    if (dx[0] != nullptr) {
      BroadcastMul(dy.data<float>(), x[1]->data<float>(), factor_size(), dx[0]->data<float>(), n,
                   factor_size(), repeat(), c.stream());
    }
  }
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(mul, CudaMulLayer);

}  // namespace cnnflow
