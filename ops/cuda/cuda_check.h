// Error checks for CUDA, cuDNN, cuBLAS and NCCL calls: a failed call throws
// cnnflow::Error naming the call, the library's message and the source
// line. Included only by files compiled with CUDA (ops/cuda/).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "ops/error.h"

namespace cnnflow::detail {
const char* CublasStatusName(cublasStatus_t status);
}  // namespace cnnflow::detail

#define CNNFLOW_CUDA_CHECK(call)                                                                   \
  do {                                                                                             \
    cudaError_t err_ = (call);                                                                     \
    if (err_ != cudaSuccess) {                                                                     \
      throw ::cnnflow::Error(::cnnflow::StrCat(#call, " failed: ", cudaGetErrorString(err_), " (", \
                                               __FILE__, ":", __LINE__, ")"));                     \
    }                                                                                              \
  } while (0)

#define CNNFLOW_CUDNN_CHECK(call)                                                                  \
  do {                                                                                             \
    cudnnStatus_t st_ = (call);                                                                    \
    if (st_ != CUDNN_STATUS_SUCCESS) {                                                             \
      throw ::cnnflow::Error(::cnnflow::StrCat(#call, " failed: ", cudnnGetErrorString(st_), " (", \
                                               __FILE__, ":", __LINE__, ")"));                     \
    }                                                                                              \
  } while (0)

#define CNNFLOW_CUBLAS_CHECK(call)                                                              \
  do {                                                                                          \
    cublasStatus_t st_ = (call);                                                                \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                         \
      throw ::cnnflow::Error(                                                                   \
          ::cnnflow::StrCat(#call, " failed: ", ::cnnflow::detail::CublasStatusName(st_), " (", \
                            __FILE__, ":", __LINE__, ")"));                                     \
    }                                                                                           \
  } while (0)

// After a kernel launch: a bad launch configuration is reported here, an
// error during the kernel at the next synchronising call.
#define CNNFLOW_CUDA_CHECK_LAUNCH() CNNFLOW_CUDA_CHECK(cudaGetLastError())
