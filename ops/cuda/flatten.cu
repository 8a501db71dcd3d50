// flatten on a GPU (ops/layers/flatten.h): the same bytes in another shape, a
// device-to-device copy ordered on the stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>
#include <vector>

#include "ops/cuda/map.cuh"
#include "ops/layers/flatten.h"

namespace cnnflow {
namespace {

using namespace cuda;  // the shared map and checks (ops/cuda/map.cuh)

class CudaFlattenLayer : public FlattenLayer {
 public:
  using FlattenLayer::FlattenLayer;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    const Tensor& in = *x[0];
    CheckGpuFloat(in, StrCat("flatten '", name(), "' input"));
    CheckGpuFloat(y, StrCat("flatten '", name(), "' output"));
    CheckSameType(in, y, StrCat("flatten '", name(), "'"));
    CNNFLOW_ENFORCE(in.numel() == y.numel(), "flatten ", name(), ": ", in.shape(), " -> ",
                    y.shape());
    // Same bytes, another shape: a device-to-device copy, ordered on the stream.
    CopyAsync(in, y, CudaContext::For(in.device()).stream());
  }

  void Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    if (dx[0] == nullptr) return;
    CheckGpuFloat(dy, StrCat("flatten '", name(), "' dy"));
    CheckGpuFloat(*dx[0], StrCat("flatten '", name(), "' dx"));
    CheckSameType(dy, *dx[0], StrCat("flatten '", name(), "' dy and dx"));
    CNNFLOW_ENFORCE(dx[0]->numel() == dy.numel(), "flatten ", name(), ": dy ", dy.shape(), " dx ",
                    dx[0]->shape());
    CopyAsync(dy, *dx[0], CudaContext::For(dy.device()).stream());
  }
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(flatten, CudaFlattenLayer);

}  // namespace cnnflow
