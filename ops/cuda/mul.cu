// mul on a GPU (ops/layers/mul.h), f32: the broadcast product of two inputs
// or a constant scale; ds sums dy x over the broadcast dimensions, one
// block per element of s (ops/cuda/broadcast_mul.cuh).
#include <cuda_runtime.h>

#include <vector>

#include "ops/cuda/broadcast_mul.cuh"
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

class CudaMulLayer : public MulLayer {
 public:
  using MulLayer::MulLayer;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    const Tensor& in = *x[0];
    const int64_t n = in.dim(0);
    CheckGpuF32(in, StrCat("mul '", name(), "' x"));
    CheckGpuF32(y, StrCat("mul '", name(), "' output"));
    CNNFLOW_ENFORCE(in.numel() == n * factor_size() * repeat() && y.numel() == in.numel(), "mul ",
                    name(), ": ", in.shape(), " -> ", y.shape());
    CudaContext& c = CudaContext::For(in.device());
    if (has_scale()) {
      const float* xs = in.data<float>();
      float* ys = y.data<float>();
      LaunchMap(ScaleOp{xs, ys, static_cast<float>(scale())}, in.numel(),
                Aligned16(xs) && Aligned16(ys), c.stream());
      return;
    }
    const Tensor& s = *x[1];
    CheckGpuF32(s, StrCat("mul '", name(), "' s"));
    CNNFLOW_ENFORCE(s.numel() == n * factor_size(), "mul ", name(), ": s ", s.shape());
    BroadcastMul(in.data<float>(), s.data<float>(), factor_size(), y.data<float>(), n,
                 factor_size(), repeat(), c.stream());
  }

  void Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    CheckGpuF32(dy, StrCat("mul '", name(), "' dy"));
    const int64_t n = dy.dim(0);
    CudaContext& c = CudaContext::For(dy.device());
    for (Tensor* d : dx) {
      if (d != nullptr) CheckGpuF32(*d, StrCat("mul '", name(), "' dx"));
    }
    if (has_scale()) {
      if (dx[0] == nullptr) return;
      const float* g = dy.data<float>();
      float* d = dx[0]->data<float>();
      LaunchMap(ScaleOp{g, d, static_cast<float>(scale())}, dy.numel(),
                Aligned16(g) && Aligned16(d), c.stream());
      return;
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
