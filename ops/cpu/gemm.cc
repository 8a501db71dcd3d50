#include "ops/cpu/gemm.h"

#include <cblas.h>
#include <dnnl.h>

#include "ops/cpu/onednn.h"
#include "ops/error.h"

namespace cnnflow::cpu {

// f32 goes through oneDNN: it dispatches on CPU features (AVX-512 here),
// while Debian's OpenBLAS 0.3.21 does not know this CPU model and falls back
// to its SSE3 kernels (5-8x slower on every shape we use; bench/README.md).
template <>
void Gemm<float>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  OneOpenMpThreadHere();
  const dnnl_status_t status =
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  CNNFLOW_ENFORCE(status == dnnl_success, "dnnl_sgemm(", m, "x", n, "x", k, ") failed: status ",
                  static_cast<int>(status));
}

// f64 (gradient checks, references) goes through OpenBLAS.
template <>
void Gemm<double>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                  int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  static const bool pinned = (openblas_set_num_threads(1), true);  // its own pool would fight TBB
  (void)pinned;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

}  // namespace cnnflow::cpu
