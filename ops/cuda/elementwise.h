// Launchers of the small CUDA kernels in ops/cuda/elementwise.cu that other
// CUDA files call (the linear layer's bias), and, for .cu files only, the
// f32 <-> f16/bf16 conversions every kernel of mixed precision uses. Each
// launcher issues its kernel on `stream` and returns without waiting.
// Compiled with CUDA only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/dtype.h"

namespace cnnflow::cuda {

// y[r, o] = bias[o] for r < rows, o < cols (y row-major [rows, cols]).
void BroadcastRows(const float* bias, float* y, int64_t rows, int64_t cols, cudaStream_t stream);
// The same with y of type y_type (f32, f16 or bf16; bias rounded to nearest even).
void BroadcastRows(const float* bias, void* y, DType y_type, int64_t rows, int64_t cols,
                   cudaStream_t stream);

// data[0..n) *= alpha (f32).
void ScaleFloats(float* data, int64_t n, float alpha, cudaStream_t stream);

// sum[o] += g[0, o] + g[1, o] + ... + g[rows - 1, o], added one row at a time
// in row order (as the CPU does, so the result is bitwise the CPU's).
void AddColumnSums(const float* g, float* sum, int64_t rows, int64_t cols, cudaStream_t stream);
// The same with g of type g_type (f32, f16 or bf16), summed in f32.
void AddColumnSums(const void* g, DType g_type, float* sum, int64_t rows, int64_t cols,
                   cudaStream_t stream);

// The collectives of replicas sharing a GPU (ops/cuda/lane_group.h), over
// `lanes` <= kMaxLanes buffers of `count` floats: every buffer =
// (their sum in the reduction tree's order, ((x0 + x1) + (x2 + x3)) + x4)
// * scale; every buffer = data[0]'s.
inline constexpr int kMaxLanes = 16;
void LaneTreeSum(float* const* data, int lanes, int64_t count, float scale, cudaStream_t stream);
void LaneBroadcast(float* const* data, int lanes, int64_t count, cudaStream_t stream);

#if defined(__CUDACC__)
// Element conversions: to f32 exactly, from f32 rounded to nearest even.
__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
#endif  // __CUDACC__

}  // namespace cnnflow::cuda
