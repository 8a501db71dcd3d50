// The CUDA kernels mul and layer_scale share (for .cu files), as
// ops/cpu/broadcast_mul.h on the CPU: x viewed as [N, M, R] times
// s[n * s_stride + m], and the sums of products that are s's gradient.
// f32. Compiled with CUDA only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/reduce.cuh"

namespace cnnflow::cuda {

// y[i] = x[i] * s[n * s_stride + m] for element i = (n * M + m) * R + r.
static __global__ void BroadcastMulKernel(const float* x, const float* s, int64_t s_stride,
                                          float* y, int64_t total, int64_t m, int64_t r) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t row = i / r;
    y[i] = x[i] * s[(row / m) * s_stride + row % m];
  }
}

inline void BroadcastMul(const float* x, const float* s, int64_t s_stride, float* y, int64_t n,
                         int64_t m, int64_t r, cudaStream_t stream) {
  const int64_t total = n * m * r;
  if (total == 0) return;
  BroadcastMulKernel<<<CudaBlocks(total), kCudaThreads, 0, stream>>>(x, s, s_stride, y, total, m,
                                                                     r);
  CNNFLOW_CUDA_CHECK_LAUNCH();
}

// One block per output element j: the sum over o < outer, k < r of
// a[e] * b[e], e = j * r + o * outer_stride + k; out[j] = it (or += it).
static __global__ void RowDotsKernel(const float* a, const float* b, float* out, int64_t r,
                                     int64_t outer, int64_t outer_stride, bool accumulate) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * r;
  float v = 0.f;
  for (int64_t t = threadIdx.x; t < outer * r; t += blockDim.x) {
    const int64_t e = base + (t / r) * outer_stride + t % r;
    v += a[e] * b[e];
  }
  v = BlockSum(v);
  if (threadIdx.x == 0) out[blockIdx.x] = accumulate ? out[blockIdx.x] + v : v;
}

inline void RowDots(const float* a, const float* b, float* out, int64_t rows, int64_t r,
                    int64_t outer, int64_t outer_stride, bool accumulate, cudaStream_t stream) {
  if (rows == 0) return;
  RowDotsKernel<<<static_cast<unsigned>(rows), kReduceThreads, 0, stream>>>(
      a, b, out, r, outer, outer_stride, accumulate);
  CNNFLOW_CUDA_CHECK_LAUNCH();
}

}  // namespace cnnflow::cuda
