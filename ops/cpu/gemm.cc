#include "ops/cpu/gemm.h"

#include <cblas.h>
#include <dnnl.h>

#include <dnnl.hpp>
#include <vector>

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

namespace {

// rows x cols of a row-major f32 matrix with leading dimension ld, rounded
// into a dense bf16 copy.
void RoundToBf16(const float* src, int64_t rows, int64_t cols, int64_t ld,
                 std::vector<uint16_t>& dst) {
  dst.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * ld;
    uint16_t* d = dst.data() + r * cols;
    for (int64_t j = 0; j < cols; ++j) d[j] = Bf16Bits(s[j]);
  }
}

}  // namespace

void GemmBf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  OneOpenMpThreadHere();
  thread_local std::vector<uint16_t> a16, b16;
  // The copies keep the stored layout; the descriptors' strides transpose.
  RoundToBf16(a, ta ? k : m, ta ? m : k, lda, a16);
  RoundToBf16(b, tb ? n : k, tb ? k : n, ldb, b16);
  using dnnl::memory;
  using dt = memory::data_type;
  const memory::desc a_md({m, k}, dt::bf16, ta ? memory::dims{1, m} : memory::dims{k, 1});
  const memory::desc b_md({k, n}, dt::bf16, tb ? memory::dims{1, k} : memory::dims{n, 1});
  const memory::desc c_md({m, n}, dt::f32, memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (beta != 0) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  try {
    // oneDNN's primitive cache makes a repeated shape cheap to recreate.
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr,
                                          OnednnEngine());
    dnnl::matmul(pd).execute(OnednnStream(),
                             {{DNNL_ARG_SRC, memory(a_md, OnednnEngine(), a16.data())},
                              {DNNL_ARG_WEIGHTS, memory(b_md, OnednnEngine(), b16.data())},
                              {DNNL_ARG_DST, memory(c_md, OnednnEngine(), c)}});
  } catch (const dnnl::error& e) {
    throw Error(StrCat("oneDNN's bf16 matmul (", m, "x", n, "x", k, ") failed: ", e.what()));
  }
}

}  // namespace cnnflow::cpu
