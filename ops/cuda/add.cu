// add on a GPU (ops/layers/add.h): the sum of two same-shaped inputs, in f32 or,
// under mixed precision, f16/bf16 computed in f32 and rounded once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>
#include <vector>

#include "ops/cuda/map.cuh"
#include "ops/layers/add.h"

namespace cnnflow {
namespace {

using namespace cuda;  // the shared map and checks (ops/cuda/map.cuh)

struct AddOp {
  const float* a;
  const float* b;
  float* y;
  __device__ void Scalar(int64_t i) const { y[i] = a[i] + b[i]; }
  __device__ void Vector(int64_t i) const {
    const float4 u = reinterpret_cast<const float4*>(a)[i];
    const float4 v = reinterpret_cast<const float4*>(b)[i];
    reinterpret_cast<float4*>(y)[i] = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
  }
};

template <typename T>
struct AddT {
  const T* a;
  const T* b;
  T* y;
  __device__ void Scalar(int64_t i) const { y[i] = FromFloat<T>(ToFloat(a[i]) + ToFloat(b[i])); }
  CNNFLOW_VECTOR_BY_SCALARS
};

class CudaAddLayer : public AddLayer {
 public:
  using AddLayer::AddLayer;
  // Our add kernel has no ReLU epilogue: the relu stays a layer.
  bool FuseRelu() override { return false; }

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    const Tensor& a = *x[0];
    const Tensor& b = *x[1];
    CNNFLOW_ENFORCE(a.shape() == b.shape() && a.numel() == y.numel(), "add ", name(), ": ",
                    a.shape(), " + ", b.shape(), " -> ", y.shape());
    CheckGpuFloat(a, StrCat("add '", name(), "' input 0"));
    CheckGpuFloat(b, StrCat("add '", name(), "' input 1"));
    CheckGpuFloat(y, StrCat("add '", name(), "' output"));
    CheckSameGpu(a, b, StrCat("add '", name(), "'"));
    CheckSameGpu(a, y, StrCat("add '", name(), "'"));
    CheckSameType(a, b, StrCat("add '", name(), "' inputs"));
    CheckSameType(a, y, StrCat("add '", name(), "' input and output"));
    CudaContext& c = CudaContext::For(a.device());
    if (a.dtype() == DType::kF32) {
      const float* as = a.data<float>();
      const float* bs = b.data<float>();
      float* ys = y.data<float>();
      LaunchMap(AddOp{as, bs, ys}, a.numel(), Aligned16(as) && Aligned16(bs) && Aligned16(ys),
                c.stream());
      return;
    }
    DispatchGpuFloat(a.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      LaunchMap(AddT<T>{static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()),
                        static_cast<T*>(y.raw_data())},
                a.numel(), true, c.stream());
    });
  }

  void Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    CheckGpuFloat(dy, StrCat("add '", name(), "' dy"));
    CudaContext& c = CudaContext::For(dy.device());
    for (Tensor* d : dx) {
      if (d == nullptr) continue;
      CheckGpuFloat(*d, StrCat("add '", name(), "' dx"));
      CheckSameType(dy, *d, StrCat("add '", name(), "' dy and dx"));
      CNNFLOW_ENFORCE(d->numel() == dy.numel(), "add ", name(), ": dy ", dy.shape(), " dx ",
                      d->shape());
      CopyAsync(dy, *d, c.stream());
    }
  }
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(add, CudaAddLayer);

}  // namespace cnnflow
