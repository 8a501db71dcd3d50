// Launchers of the small CUDA kernels in ops/cuda/elementwise.cu that other
// CUDA files call (the linear layer's bias). Each issues its kernel on
// `stream` and returns without waiting. Compiled with CUDA only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cnnflow::cuda {

// y[r, o] = bias[o] for r < rows, o < cols (y row-major [rows, cols]).
void BroadcastRows(const float* bias, float* y, int64_t rows, int64_t cols, cudaStream_t stream);

// sum[o] += g[0, o] + g[1, o] + ... + g[rows - 1, o], added one row at a time
// in row order (as the CPU does, so the result is bitwise the CPU's).
void AddColumnSums(const float* g, float* sum, int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace cnnflow::cuda
