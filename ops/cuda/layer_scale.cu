// layer_scale on a GPU (ops/layers/layer_scale.h), f32: y = gamma[c] x;
// dgamma[c] += the sum over the batch and positions of dy x, one block per
// channel (ops/cuda/broadcast_mul.cuh).
#include <cuda_runtime.h>

#include <vector>

#include "ops/cuda/broadcast_mul.cuh"
#include "ops/cuda/map.cuh"
#include "ops/layers/layer_scale.h"

namespace cnnflow {
namespace {

using namespace cuda;

class CudaLayerScaleLayer : public LayerScaleLayer {
 public:
  using LayerScaleLayer::LayerScaleLayer;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    const Tensor& in = *x[0];
    const int64_t n = in.dim(0);
    CheckGpuF32(in, StrCat("layer_scale '", name(), "' input"));
    CheckGpuF32(y, StrCat("layer_scale '", name(), "' output"));
    CNNFLOW_ENFORCE(in.numel() == n * channels() * positions() && y.numel() == in.numel(),
                    "layer_scale ", name(), ": ", in.shape(), " -> ", y.shape());
    BroadcastMul(in.data<float>(), parameters()[0].value.data<float>(), 0, y.data<float>(), n,
                 channels(), positions(), CudaContext::For(in.device()).stream());
  }

  void Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    CheckGpuF32(dy, StrCat("layer_scale '", name(), "' dy"));
    const int64_t n = dy.dim(0);
    CNNFLOW_ENFORCE(dy.numel() == n * channels() * positions(), "layer_scale ", name(), ": dy ",
                    dy.shape());
    cudaStream_t stream = CudaContext::For(dy.device()).stream();
    Parameter& gamma = parameters()[0];
    if (dx[0] != nullptr) {
      CheckGpuF32(*dx[0], StrCat("layer_scale '", name(), "' dx"));
      BroadcastMul(dy.data<float>(), gamma.value.data<float>(), 0, dx[0]->data<float>(), n,
                   channels(), positions(), stream);
    }
    if (n > 0) {
      RowDots(dy.data<float>(), x[0]->data<float>(), gamma.grad.data<float>(), channels(),
              positions(), n, channels() * positions(), true, stream);
    }
  }
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(layer_scale, CudaLayerScaleLayer);

}  // namespace cnnflow
