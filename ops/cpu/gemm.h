// Row-major GEMM on the host, single-threaded per call (TBB owns the
// parallelism, see ops/cpu/parallel.h): f32 through oneDNN's sgemm, f64
// through OpenBLAS; and bf16 products over f32 matrices through oneDNN's
// matmul (graph.precision: bf16 on a CPU with native bf16).
//   C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C
#pragma once

#include <cstdint>

namespace cnnflow::cpu {

template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// C = op(A) op(B) + beta * C with A and B rounded to bf16 (nearest even) and
// the products summed in f32. Only where cpu::NoNativeBf16Reason() is "".
void GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// f32 -> bf16 bits, rounded to nearest even (NaN stays NaN), as PyTorch's.
inline uint16_t Bf16Bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

}  // namespace cnnflow::cpu
