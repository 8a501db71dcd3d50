// The activation layers on a GPU (ops/layers/activation.h): one map functor
// pair per function, made from the same act:: definitions the CPU uses,
// computed in f32; under mixed precision the f16/bf16 values are widened to
// f32 and the result rounded once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>
#include <vector>

#include "ops/cuda/map.cuh"
#include "ops/layers/activation.h"

namespace cnnflow {
namespace {

using namespace cuda;  // the shared map and checks (ops/cuda/map.cuh)

// y = Op(x).
template <typename Op, typename T>
struct ActivationForward {
  const T* x;
  T* y;
  float a;
  __device__ void Scalar(int64_t i) const { y[i] = FromFloat<T>(Op::Forward(ToFloat(x[i]), a)); }
  __device__ void Vector(int64_t i) const {
    if constexpr (std::is_same_v<T, float>) {
      const float4 v = reinterpret_cast<const float4*>(x)[i];
      reinterpret_cast<float4*>(y)[i] = make_float4(Op::Forward(v.x, a), Op::Forward(v.y, a),
                                                    Op::Forward(v.z, a), Op::Forward(v.w, a));
    } else {
      for (int64_t k = 4 * i; k < 4 * i + 4; ++k) Scalar(k);
    }
  }
};

// dx = dy * Op'(x).
template <typename Op, typename T>
struct ActivationBackward {
  const T* x;
  const T* dy;
  T* dx;
  float a;
  __device__ void Scalar(int64_t i) const {
    dx[i] = FromFloat<T>(Op::Backward(ToFloat(x[i]), ToFloat(dy[i]), a));
  }
  __device__ void Vector(int64_t i) const {
    if constexpr (std::is_same_v<T, float>) {
      const float4 v = reinterpret_cast<const float4*>(x)[i];
      const float4 g = reinterpret_cast<const float4*>(dy)[i];
      reinterpret_cast<float4*>(dx)[i] =
          make_float4(Op::Backward(v.x, g.x, a), Op::Backward(v.y, g.y, a),
                      Op::Backward(v.z, g.z, a), Op::Backward(v.w, g.w, a));
    } else {
      for (int64_t k = 4 * i; k < 4 * i + 4; ++k) Scalar(k);
    }
  }
};

// float4 loads need 16-byte alignment; the half types go element by element.
template <typename T>
bool VectorOk(const void* p) {
  return !std::is_same_v<T, float> || Aligned16(p);
}

class CudaActivationLayer : public ActivationLayer {
 public:
  using ActivationLayer::ActivationLayer;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    const Tensor& in = *x[0];
    const std::string what = StrCat(type(), " '", name(), "'");
    CheckGpuFloat(in, what + " input");
    CheckGpuFloat(y, what + " output");
    CheckSameGpu(in, y, what);
    CheckSameType(in, y, what);
    CheckForward(in, y);
    cudaStream_t stream = CudaContext::For(in.device()).stream();
    DispatchGpuFloat(in.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      const T* xs = static_cast<const T*>(in.raw_data());
      T* ys = static_cast<T*>(y.raw_data());
      VisitActivation(kind(), [&](auto op) {
        using Op = decltype(op);
        LaunchMap(ActivationForward<Op, T>{xs, ys, static_cast<float>(alpha())}, in.numel(),
                  VectorOk<T>(xs) && VectorOk<T>(ys), stream);
      });
    });
  }

  void Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    if (dx[0] == nullptr) return;
    const Tensor& in = *x[0];
    const std::string what = StrCat(type(), " '", name(), "'");
    CheckGpuFloat(in, what + " x");
    CheckGpuFloat(dy, what + " dy");
    CheckGpuFloat(*dx[0], what + " dx");
    CheckSameType(in, dy, what + " x and dy");
    CheckSameType(dy, *dx[0], what + " dy and dx");
    CheckBackward(in, dy, *dx[0]);
    cudaStream_t stream = CudaContext::For(in.device()).stream();
    DispatchGpuFloat(in.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      const T* xs = static_cast<const T*>(in.raw_data());
      const T* g = static_cast<const T*>(dy.raw_data());
      T* d = static_cast<T*>(dx[0]->raw_data());
      VisitActivation(kind(), [&](auto op) {
        using Op = decltype(op);
        LaunchMap(ActivationBackward<Op, T>{xs, g, d, static_cast<float>(alpha())}, in.numel(),
                  VectorOk<T>(xs) && VectorOk<T>(g) && VectorOk<T>(d), stream);
      });
    });
  }
};

// The registered CUDA class of each YAML type.
template <Activation K>
class CudaActivationOf final : public CudaActivationLayer {
 public:
  CudaActivationOf(const std::string& name, const Args& args)
      : CudaActivationLayer(K, name, args) {}
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(gelu, CudaActivationOf<Activation::kGeluErf>);
CNNFLOW_REGISTER_CUDA_LAYER(silu, CudaActivationOf<Activation::kSilu>);
CNNFLOW_REGISTER_CUDA_LAYER(sigmoid, CudaActivationOf<Activation::kSigmoid>);
CNNFLOW_REGISTER_CUDA_LAYER(tanh, CudaActivationOf<Activation::kTanh>);
CNNFLOW_REGISTER_CUDA_LAYER(hardsigmoid, CudaActivationOf<Activation::kHardsigmoid>);
CNNFLOW_REGISTER_CUDA_LAYER(hardswish, CudaActivationOf<Activation::kHardswish>);
CNNFLOW_REGISTER_CUDA_LAYER(relu6, CudaActivationOf<Activation::kRelu6>);
CNNFLOW_REGISTER_CUDA_LAYER(leaky_relu, CudaActivationOf<Activation::kLeakyRelu>);

}  // namespace cnnflow
