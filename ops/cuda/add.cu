// add on a GPU (ops/layers/add.h): the sum of two same-shaped inputs, in f32 or,
// under mixed precision, f16/bf16 computed in f32 and rounded once. With a
// fused ReLU (a residual join's), y = max(a + b, 0) in the same pass, and
// backward writes dy masked by y > 0 to both inputs in one pass. An input
// written by a channels-last batchnorm read by nothing else is normalised
// here (FuseProducer): y = relu(bn(x) + b), so that batchnorm writes no
// output in training.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>
#include <vector>

#include "ops/cuda/batch_norm_kernels.h"
#include "ops/cuda/map.cuh"
#include "ops/layers/add.h"

namespace cnnflow {
namespace {

using namespace cuda;  // the shared map and checks (ops/cuda/map.cuh)

// The relu layer's ReLU (NaN -> 0), or none.
template <bool kRelu>
__device__ __forceinline__ float Out(float v) {
  return kRelu ? (v > 0.f ? v : 0.f) : v;
}

template <bool kRelu>
struct AddOp {
  const float* a;
  const float* b;
  float* y;
  __device__ void Scalar(int64_t i) const { y[i] = Out<kRelu>(a[i] + b[i]); }
  __device__ void Vector(int64_t i) const {
    const float4 u = reinterpret_cast<const float4*>(a)[i];
    const float4 v = reinterpret_cast<const float4*>(b)[i];
    reinterpret_cast<float4*>(y)[i] = make_float4(Out<kRelu>(u.x + v.x), Out<kRelu>(u.y + v.y),
                                                  Out<kRelu>(u.z + v.z), Out<kRelu>(u.w + v.w));
  }
};

template <typename T, bool kRelu>
struct AddT {
  const T* a;
  const T* b;
  T* y;
  __device__ void Scalar(int64_t i) const {
    y[i] = FromFloat<T>(Out<kRelu>(ToFloat(a[i]) + ToFloat(b[i])));
  }
  CNNFLOW_VECTOR_BY_SCALARS
};

// Both inputs' gradients of a fused ReLU: dy where y > 0, else 0 (either
// output may be null).
template <typename T>
struct ReluGradTwice {
  const T* y;
  const T* dy;
  T* d0;
  T* d1;
  __device__ void Scalar(int64_t i) const {
    const T g = ToFloat(y[i]) > 0.f ? dy[i] : FromFloat<T>(0.f);
    if (d0) d0[i] = g;
    if (d1) d1[i] = g;
  }
  CNNFLOW_VECTOR_BY_SCALARS
};

class CudaAddLayer : public AddLayer {
 public:
  using AddLayer::AddLayer;
  bool FuseRelu() override {
    fused_relu_ = true;
    return true;
  }
  bool FuseProducer(size_t input, Layer& producer) override {
    auto* bn = dynamic_cast<cuda::DeferredNormalise*>(&producer);
    if (bn_ != nullptr || bn == nullptr || !bn->DeferToReader()) return false;
    bn_ = bn;
    bn_input_ = input;
    return true;
  }

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
    if (bn_ != nullptr && bn_->NormaliseAdd(*x[1 - bn_input_], y, fused_relu_)) return;
    if (fused_relu_) {
      Launch<true>(a, b, y, c.stream());
    } else {
      Launch<false>(a, b, y, c.stream());
    }
  }

  void Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    CheckGpuFloat(dy, StrCat("add '", name(), "' dy"));
    CudaContext& c = CudaContext::For(dy.device());
    for (Tensor* d : dx) {
      if (d == nullptr) continue;
      CheckGpuFloat(*d, StrCat("add '", name(), "' dx"));
      CheckSameType(dy, *d, StrCat("add '", name(), "' dy and dx"));
      CNNFLOW_ENFORCE(d->numel() == dy.numel(), "add ", name(), ": dy ", dy.shape(), " dx ",
                      d->shape());
      if (!fused_relu_) CopyAsync(dy, *d, c.stream());
    }
    if (!fused_relu_ || (dx[0] == nullptr && dx[1] == nullptr)) return;
    CheckSameType(dy, y, StrCat("add '", name(), "' dy and y"));
    DispatchGpuFloat(dy.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      auto out = [](Tensor* d) { return d ? static_cast<T*>(d->raw_data()) : nullptr; };
      LaunchMap(ReluGradTwice<T>{static_cast<const T*>(y.raw_data()),
                                 static_cast<const T*>(dy.raw_data()), out(dx[0]), out(dx[1])},
                dy.numel(), true, c.stream());
    });
  }

 private:
  template <bool kRelu>
  static void Launch(const Tensor& a, const Tensor& b, Tensor& y, cudaStream_t stream) {
    if (a.dtype() == DType::kF32) {
      const float* as = a.data<float>();
      const float* bs = b.data<float>();
      float* ys = y.data<float>();
      LaunchMap(AddOp<kRelu>{as, bs, ys}, a.numel(),
                Aligned16(as) && Aligned16(bs) && Aligned16(ys), stream);
      return;
    }
    DispatchGpuFloat(a.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      LaunchMap(AddT<T, kRelu>{static_cast<const T*>(a.raw_data()),
                               static_cast<const T*>(b.raw_data()), static_cast<T*>(y.raw_data())},
                a.numel(), true, stream);
    });
  }

  bool fused_relu_ = false;  // FuseRelu
  // FuseProducer: the batchnorm that writes input bn_input_, normalised here.
  cuda::DeferredNormalise* bn_ = nullptr;
  size_t bn_input_ = 0;
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(add, CudaAddLayer);

}  // namespace cnnflow
