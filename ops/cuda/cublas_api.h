// cuBLAS, loaded at run time: libcublas.so.13, else libcublas.so.12. The
// functions cnnflow calls have the same C API and ABI in both, so a binary
// built with CUDA 13 also runs where only CUDA 12's cuBLAS is installed (as
// with PyTorch's cu12 wheels on a GPU machine that we carry binaries to:
// cuBLAS is far too big to carry). Call through Cublas().Sgemm(...) and so
// on; the first call loads the library or throws an Error naming what was
// tried. Compiled with CUDA only.
#pragma once

#include <cublas_v2.h>

#include <string>

namespace cnnflow::detail {

struct CublasApi {
  decltype(&cublasCreate_v2) Create = nullptr;
  decltype(&cublasDestroy_v2) Destroy = nullptr;
  decltype(&cublasSetStream_v2) SetStream = nullptr;
  decltype(&cublasSetMathMode) SetMathMode = nullptr;
  decltype(&cublasSgemm_v2) Sgemm = nullptr;
  decltype(&cublasSgemmStridedBatched) SgemmStridedBatched = nullptr;
  // The C function (C++ also sees an inline overload taking cudaDataType).
  cublasStatus_t (*GemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                           const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                           int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                           cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetProperty) GetProperty = nullptr;
  std::string library;  // the file that was loaded
};

// Loaded once (thread-safe); throws Error when no cuBLAS can be loaded.
const CublasApi& Cublas();

}  // namespace cnnflow::detail
