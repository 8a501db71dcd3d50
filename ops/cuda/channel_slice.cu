// channel_slice on a GPU (ops/layers/channel_slice.h): one 2D copy of N rows
// (each sample's block of channels) on the compute stream, in any float
// type; backward zeroes dx and copies dy into the block.
#include <cuda_runtime.h>

#include <vector>

#include "ops/cuda/map.cuh"
#include "ops/layers/channel_slice.h"

namespace cnnflow {
namespace {

using namespace cuda;  // the shared checks (ops/cuda/map.cuh)

class CudaChannelSliceLayer : public ChannelSliceLayer {
 public:
  using ChannelSliceLayer::ChannelSliceLayer;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    Copy(const_cast<Tensor&>(*x[0]), y, true);
  }

  void Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    if (dx[0] == nullptr) return;
    CudaContext& c = CudaContext::For(dy.device());
    CNNFLOW_CUDA_CHECK(cudaMemsetAsync(dx[0]->raw_data(), 0, dx[0]->nbytes(), c.stream()));
    Copy(*dx[0], const_cast<Tensor&>(dy), false);
  }

 private:
  // to_part: whole's channels [start, end) -> part; else part -> them.
  void Copy(Tensor& whole, Tensor& part, bool to_part) {
    const std::string what = StrCat("channel_slice '", name(), "'");
    CheckGpuFloat(whole, what);
    CheckSameGpu(whole, part, what);
    CheckSameType(whole, part, what);
    const int64_t n = whole.dim(0);
    const size_t es = DTypeSize(whole.dtype());
    const size_t width = (end() - start()) * plane() * es, pitch = channels() * plane() * es;
    CNNFLOW_ENFORCE(whole.numel() == n * channels() * plane() && part.numel() * es == n * width,
                    what, ": ", whole.shape(), " and ", part.shape());
    if (n == 0) return;
    char* block = static_cast<char*>(whole.raw_data()) + start() * plane() * es;
    cudaStream_t s = CudaContext::For(whole.device()).stream();
    if (to_part) {
      CNNFLOW_CUDA_CHECK(cudaMemcpy2DAsync(part.raw_data(), width, block, pitch, width, n,
                                           cudaMemcpyDeviceToDevice, s));
    } else {
      CNNFLOW_CUDA_CHECK(cudaMemcpy2DAsync(block, pitch, part.raw_data(), width, width, n,
                                           cudaMemcpyDeviceToDevice, s));
    }
  }
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(channel_slice, CudaChannelSliceLayer);

}  // namespace cnnflow
