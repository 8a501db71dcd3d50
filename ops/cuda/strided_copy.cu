// StridedCopy (ops/cuda/strided_copy.h): one thread an element, grid-stride.
#include <cuda_runtime.h>

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/strided_copy.h"

namespace cnnflow::cuda {
namespace {

template <bool kAccumulate>
__global__ void StridedCopyKernel(float* __restrict__ dst, int64_t dst_pitch,
                                  const float* __restrict__ src, int64_t src_pitch, int64_t width,
                                  int64_t n, float alpha) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k / width, j = k - i * width;
    const float v = alpha * src[i * src_pitch + j];
    float& out = dst[i * dst_pitch + j];
    out = kAccumulate ? out + v : v;
  }
}

}  // namespace

void StridedCopy(Device device, float* dst, int64_t dst_pitch, const float* src, int64_t src_pitch,
                 int64_t width, int64_t height, float alpha, bool accumulate) {
  const int64_t n = width * height;
  if (n == 0) return;
  const cudaStream_t stream = CudaContext::For(device).stream();
  if (accumulate) {
    StridedCopyKernel<true><<<CudaBlocks(n), kCudaThreads, 0, stream>>>(dst, dst_pitch, src,
                                                                        src_pitch, width, n, alpha);
  } else {
    StridedCopyKernel<false><<<CudaBlocks(n), kCudaThreads, 0, stream>>>(
        dst, dst_pitch, src, src_pitch, width, n, alpha);
  }
  CNNFLOW_CUDA_CHECK_LAUNCH();
}

}  // namespace cnnflow::cuda
