// Block-wide sums for the CUDA kernels of the normalisation and broadcast
// layers (for .cu files): a fixed shuffle tree, so a sum is the same on
// every run. Compiled with CUDA only.
#pragma once

#include <cuda_runtime.h>

namespace cnnflow::cuda {

inline constexpr int kReduceThreads = 256;  // threads of a reducing block (a multiple of 32)

// The sum of v over the block's threads, returned to every thread. Every
// thread of the block must call it (it synchronises the block).
__device__ inline float BlockSum(float v) {
  __shared__ float warp_sums[32];
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // the previous call's readers are done with warp_sums
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? warp_sums[lane] : 0.f;
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The same in double (SyncBN's sums).
__device__ inline double BlockSum(double v) {
  __shared__ double warp_sums_d[32];
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) warp_sums_d[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? warp_sums_d[lane] : 0.0;
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace cnnflow::cuda
