// flatten on a GPU (ops/layers/flatten.h): the same bytes in another shape, a
// device-to-device copy ordered on the stream. A channels-last input
// (Layer::SetChannelsLast) is flattened in NCHW order, as PyTorch's flatten
// of a channels_last tensor: a transpose (cuda::ChangeLayout) unless its
// planes are 1 x 1.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>
#include <vector>

#include "ops/cuda/kernels.h"
#include "ops/cuda/map.cuh"
#include "ops/layers/flatten.h"

namespace cnnflow {
namespace {

using namespace cuda;  // the shared map and checks (ops/cuda/map.cuh)

class CudaFlattenLayer : public FlattenLayer {
 public:
  using FlattenLayer::FlattenLayer;

  ChannelsLast ChannelsLastSupport() const override { return ChannelsLast::kConverts; }

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    const Tensor& in = *x[0];
    CheckGpuFloat(in, StrCat("flatten '", name(), "' input"));
    CheckGpuFloat(y, StrCat("flatten '", name(), "' output"));
    CheckSameType(in, y, StrCat("flatten '", name(), "'"));
    CNNFLOW_ENFORCE(in.numel() == y.numel(), "flatten ", name(), ": ", in.shape(), " -> ",
                    y.shape());
    if (Transposes(in)) {
      Tensor y4 = y.Reshape(in.shape());
      ChangeLayout(in, y4, /*to_nhwc=*/false);
      return;
    }
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
    if (Transposes(*dx[0])) {
      const Tensor dy4 = dy.Reshape(dx[0]->shape());
      ChangeLayout(dy4, *dx[0], /*to_nhwc=*/true);
      return;
    }
    CopyAsync(dy, *dx[0], CudaContext::For(dy.device()).stream());
  }

 private:
  // Whether x (the input, or its gradient) is stored NHWC with planes of
  // more than one cell.
  bool Transposes(const Tensor& x) const {
    return nhwc_input() && x.rank() == 4 && x.dim(2) * x.dim(3) > 1;
  }
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(flatten, CudaFlattenLayer);

}  // namespace cnnflow
