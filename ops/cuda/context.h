// What the CUDA kernels of one GPU share: its compute stream and the cuDNN
// and cuBLAS handles bound to it, and a workspace for cuDNN.
//
// Ordering rule: every kernel, cuDNN and cuBLAS call of a device runs on
// its ONE compute stream, in the order the host issues it. So memory from
// the device's caching pool (ops/device.h) may be released as soon as the
// host has issued the last kernel that uses it: the next user of the block
// runs after it on the same stream. Work on another stream (a copy stream,
// NCCL's stream) orders itself against the compute stream with events and
// uses memory that is not returned to the pool while it runs.
//
// One host thread drives a device's compute stream at a time (a replica or
// a pipeline stage per device); the handles are not for concurrent use.
// A GPU listed several times has a context per lane (ops/device.h's
// GpuLaneScope): each replica on it its own stream, handles and pool.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <memory>
#include <mutex>

#include "ops/device.h"
#include "ops/device_ops.h"

namespace cnnflow {

class CudaContext {
 public:
  // The context of GPU `device` in the calling thread's lane (made on first
  // use; lives until exit).
  static CudaContext& Get(int device);
  // The context of a CUDA tensor's device; makes it the current device.
  static CudaContext& For(Device device);

  int device() const { return device_; }
  int lane() const { return lane_; }
  cudaStream_t stream() const { return stream_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  // Made on first use: a model without linear layers runs even where no
  // cuBLAS can be loaded (ops/cuda/cublas_api.h).
  cublasHandle_t cublas();
  // Scratch device memory of at least `bytes` for the next call on the
  // compute stream (grows, never shrinks; valid until the next Workspace).
  void* Workspace(size_t bytes);
  size_t workspace_bytes() const { return workspace_ ? workspace_->bytes() : 0; }
  // How f32 convolutions may compute (graph.tf32, graph.deterministic:
  // ops/device_ops.h's GpuMathOptions); the cuDNN layers read it when they
  // choose their algorithms, so set it before a model's first step.
  void SetMath(const GpuMathOptions& math);
  GpuMathOptions math() const;
  // Makes this the calling thread's current device.
  void Activate() const;
  // Blocks until the compute stream has done all that was issued.
  void Synchronize() const;

  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

 private:
  CudaContext(int device, int lane);
  int device_;
  int lane_;
  cudaStream_t stream_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::mutex cublas_mu_;
  std::unique_ptr<Storage> workspace_;
  mutable std::mutex math_mu_;
  GpuMathOptions math_;
};

// Threads per block and the grid size for an elementwise kernel over n
// items (grid-stride loops cover the rest).
inline constexpr int kCudaThreads = 256;
inline unsigned CudaBlocks(long long n) {
  const long long b = (n + kCudaThreads - 1) / kCudaThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 4 ? 65535 * 4 : b));
}

}  // namespace cnnflow
