// What the elementwise CUDA kernels share (for .cu files): tensor checks
// that name the operand, the f32/f16/bf16 dispatch, and the grid-stride map
// of a functor over n elements (float4 groups when aligned). Compiled with
// CUDA only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/tensor.h"

namespace cnnflow::cuda {

// A contiguous f32 tensor on a GPU, or an Error naming `what`.
inline void CheckGpuF32(const Tensor& t, const std::string& what) {
  if (!t.device().is_cuda()) {
    throw Error(
        StrCat(what, " is on ", t.device().ToString(), "; a CUDA kernel needs a GPU tensor"));
  }
  if (t.dtype() != DType::kF32) {
    throw Error(StrCat(what, " is ", DTypeName(t.dtype()), "; CUDA kernels take f32 only"));
  }
  CNNFLOW_ENFORCE(t.is_contiguous(), what, " ", t.shape(), " is not contiguous");
}

inline void CheckSameGpu(const Tensor& a, const Tensor& b, const std::string& what) {
  CNNFLOW_ENFORCE(a.device() == b.device(), what, ": tensors on ", a.device().ToString(), " and ",
                  b.device().ToString());
}

// A contiguous f32, f16 or bf16 tensor on a GPU, or an Error naming `what`.
inline void CheckGpuFloat(const Tensor& t, const std::string& what) {
  if (!t.device().is_cuda()) {
    throw Error(
        StrCat(what, " is on ", t.device().ToString(), "; a CUDA kernel needs a GPU tensor"));
  }
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kF16 && t.dtype() != DType::kBF16) {
    throw Error(StrCat(what, " is ", DTypeName(t.dtype()), "; CUDA kernels take f32, f16 or bf16"));
  }
  CNNFLOW_ENFORCE(t.is_contiguous(), what, " ", t.shape(), " is not contiguous");
}

inline void CheckSameType(const Tensor& a, const Tensor& b, const std::string& what) {
  CNNFLOW_ENFORCE(a.dtype() == b.dtype(), what, ": ", DTypeName(a.dtype()), " and ",
                  DTypeName(b.dtype()), " tensors");
}

// Calls fn with a null pointer of the element type of f32, f16 or bf16.
template <typename Fn>
inline void DispatchGpuFloat(DType t, Fn&& fn) {
  switch (t) {
    case DType::kF32:
      fn(static_cast<float*>(nullptr));
      return;
    case DType::kF16:
      fn(static_cast<__half*>(nullptr));
      return;
    case DType::kBF16:
      fn(static_cast<__nv_bfloat16*>(nullptr));
      return;
    default:
      throw Error(StrCat("no CUDA kernel for dtype ", DTypeName(t)));
  }
}

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Half-precision (and generic) functors: computed in f32, rounded once. The
// vector form takes elements 4i .. 4i+3 one by one (no alignment needed).
#define CNNFLOW_VECTOR_BY_SCALARS                          \
  __device__ void Vector(int64_t i) const {                \
    for (int64_t k = 4 * i; k < 4 * i + 4; ++k) Scalar(k); \
  }

// Grid-stride over n elements: float4 groups first when `vec`, then the tail.
template <typename Op>
__global__ void MapKernel(Op op, int64_t n, bool vec) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t begin = 0;
  if (vec) {
    const int64_t n4 = n / 4;
    for (int64_t i = tid; i < n4; i += stride) op.Vector(i);
    begin = n4 * 4;
  }
  for (int64_t i = begin + tid; i < n; i += stride) op.Scalar(i);
}

template <typename Op>
void LaunchMap(const Op& op, int64_t n, bool aligned, cudaStream_t stream) {
  if (n == 0) return;
  const bool vec = aligned && n >= 4;
  MapKernel<Op><<<CudaBlocks(vec ? n / 4 : n), kCudaThreads, 0, stream>>>(op, n, vec);
  CNNFLOW_CUDA_CHECK_LAUNCH();
}

inline void CopyAsync(const Tensor& src, Tensor& dst, cudaStream_t stream) {
  if (dst.raw_data() == src.raw_data() || src.nbytes() == 0) return;
  CNNFLOW_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(),
                                     cudaMemcpyDeviceToDevice, stream));
}

}  // namespace cnnflow::cuda
