// Row-major GEMM on the host, single-threaded per call (TBB owns the
// parallelism, see ops/cpu/parallel.h): f32 through oneDNN's sgemm, f64
// through OpenBLAS.
//   C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C
#pragma once

#include <cstdint>

namespace cnnflow::cpu {

template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

}  // namespace cnnflow::cpu
