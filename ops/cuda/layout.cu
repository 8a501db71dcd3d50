// Channels-last on GPUs (ops/cuda/kernels.h's ChangeLayout): a tensor's
// samples moved between [C, H*W] (NCHW) and [H*W, C] (NHWC) storage, its
// type converted on the way, as a batched transpose through shared memory
// (32 x 32 tiles: both the reads and the writes are coalesced).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/map.cuh"

namespace cnnflow::cuda {
namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;  // a block is kTile x kRowsPerPass threads

// dst[b][c][r] = src[b][r][c] for each of `batch` [rows, cols] matrices of
// src (row-major), converted to D; with accumulate, dst += instead (D f32).
template <typename S, typename D, bool kAccumulate>
__global__ void TransposeKernel(const S* __restrict__ src, D* __restrict__ dst, int64_t rows,
                                int64_t cols) {
  __shared__ float tile[kTile][kTile + 1];  // +1: no shared-memory bank conflicts
  const int64_t b = blockIdx.z;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const S* in = src + b * rows * cols;
  D* out = dst + b * rows * cols;
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = ToFloat(in[r * cols + c]);
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float v = tile[threadIdx.x][i];
      if constexpr (kAccumulate) {
        out[c * rows + r] += v;
      } else {
        out[c * rows + r] = FromFloat<D>(v);
      }
    }
  }
}

template <typename S, typename D, bool kAccumulate>
void LaunchTranspose(const void* src, void* dst, int64_t batch, int64_t rows, int64_t cols,
                     cudaStream_t stream) {
  const dim3 block(kTile, kRowsPerPass);
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                  static_cast<unsigned>((rows + kTile - 1) / kTile), static_cast<unsigned>(batch));
  TransposeKernel<S, D, kAccumulate>
      <<<grid, block, 0, stream>>>(static_cast<const S*>(src), static_cast<D*>(dst), rows, cols);
  CNNFLOW_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void ChangeLayout(const Tensor& src, Tensor& dst, bool to_nhwc, bool accumulate) {
  CheckGpuFloat(src, "ChangeLayout's source");
  CheckGpuFloat(dst, "ChangeLayout's destination");
  CheckSameGpu(src, dst, "ChangeLayout");
  CNNFLOW_ENFORCE(src.rank() == 4 && dst.rank() == 4 && src.shape() == dst.shape(),
                  "ChangeLayout takes two [N, C, H, W] tensors of one shape, got ", src.shape(),
                  " and ", dst.shape());
  CNNFLOW_ENFORCE(src.is_contiguous() && dst.is_contiguous(), "ChangeLayout of ", src.shape(),
                  ": the tensors must be contiguous");
  CNNFLOW_ENFORCE(!accumulate || dst.dtype() == DType::kF32,
                  "ChangeLayout adds into f32 only, got ", DTypeName(dst.dtype()));
  CNNFLOW_ENFORCE(src.dim(0) <= 65535, "ChangeLayout of ", src.shape(),
                  ": at most 65535 samples per call");
  if (src.numel() == 0) return;
  const int64_t c = src.dim(1), hw = src.dim(2) * src.dim(3);
  // Each sample is a [rows, cols] matrix of the source's storage.
  const int64_t rows = to_nhwc ? c : hw, cols = to_nhwc ? hw : c;
  cudaStream_t stream = CudaContext::For(dst.device()).stream();
  DispatchGpuFloat(src.dtype(), [&](auto* stag) {
    using S = std::remove_pointer_t<decltype(stag)>;
    if (accumulate) {
      LaunchTranspose<S, float, true>(src.raw_data(), dst.raw_data(), src.dim(0), rows, cols,
                                      stream);
      return;
    }
    DispatchGpuFloat(dst.dtype(), [&](auto* dtag) {
      using D = std::remove_pointer_t<decltype(dtag)>;
      LaunchTranspose<S, D, false>(src.raw_data(), dst.raw_data(), src.dim(0), rows, cols, stream);
    });
  });
}

}  // namespace cnnflow::cuda
