// channel_shuffle on a GPU (ops/layers/channel_shuffle.h): one kernel moves
// every value to its permuted channel plane, in any float type (no
// arithmetic).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>
#include <vector>

#include "ops/cuda/map.cuh"
#include "ops/layers/channel_shuffle.h"

namespace cnnflow {
namespace {

using namespace cuda;  // the shared checks and launches (ops/cuda/map.cuh)

// dst[n, c, p] = src[n, source(c), p] (gather), or its inverse (scatter).
template <typename T>
struct ShuffleOp {
  const T* src;
  T* dst;
  int64_t channels, groups, plane;
  bool gather;
  __device__ void Scalar(int64_t i) const {
    const int64_t p = i % plane, c = (i / plane) % channels, n = i / (plane * channels);
    const int64_t s = (c % groups) * (channels / groups) + c / groups;
    const int64_t other = (n * channels + s) * plane + p;
    if (gather) {
      dst[i] = src[other];
    } else {
      dst[other] = src[i];
    }
  }
  CNNFLOW_VECTOR_BY_SCALARS
};

class CudaChannelShuffleLayer : public ChannelShuffleLayer {
 public:
  using ChannelShuffleLayer::ChannelShuffleLayer;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    Permute(*x[0], y, true, "output");
  }

  void Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    if (dx[0] != nullptr) Permute(dy, *dx[0], false, "dx");
  }

 private:
  void Permute(const Tensor& src, Tensor& dst, bool gather, const char* what) {
    const std::string where = StrCat("channel_shuffle '", name(), "' ", what);
    CheckGpuFloat(src, where);
    CheckGpuFloat(dst, where);
    CheckSameGpu(src, dst, where);
    CheckSameType(src, dst, where);
    CNNFLOW_ENFORCE(src.numel() == dst.numel() && src.numel() % (channels() * plane()) == 0, where,
                    ": ", src.shape(), " -> ", dst.shape());
    DispatchGpuFloat(src.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      const ShuffleOp<T> op{static_cast<const T*>(src.raw_data()),
                            static_cast<T*>(dst.raw_data()),
                            channels(),
                            groups(),
                            plane(),
                            gather};
      LaunchMap(op, src.numel(), false, CudaContext::For(src.device()).stream());
    });
  }
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(channel_shuffle, CudaChannelShuffleLayer);

}  // namespace cnnflow
