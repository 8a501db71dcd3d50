// Products with a factor broadcast over the trailing dimensions, shared by
// mul and layer_scale: x viewed as [N, M, R] times s[n * s_stride + m]
// (s_stride M: a factor per sample and row, as mul's second input; 0: one
// factor row for the whole batch, as layer_scale's gamma).
#pragma once

#include <algorithm>
#include <cstdint>

#include "ops/cpu/elementwise.h"
#include "ops/cpu/parallel.h"

namespace cnnflow::cpu {

// Elements per parallel task.
inline constexpr int64_t kBroadcastGrain = int64_t{1} << 15;

// y[n, m, r] = x[n, m, r] * s[n * s_stride + m] (y may be x).
template <typename T>
void BroadcastMul(const T* x, const T* s, int64_t s_stride, T* y, int64_t n, int64_t m, int64_t r) {
  if (r == 1) {  // the factor changes every element: vectorise over m
    ParallelFor(n, std::max<int64_t>(1, kBroadcastGrain / std::max<int64_t>(m, 1)),
                [&](int64_t b, int64_t e) {
                  for (int64_t i = b; i < e; ++i) {
                    const T* si = s + i * s_stride;
                    const T* xi = x + i * m;
                    T* yi = y + i * m;
                    for (int64_t j = 0; j < m; ++j) yi[j] = xi[j] * si[j];
                  }
                });
    return;
  }
  ParallelFor(n * m, std::max<int64_t>(1, kBroadcastGrain / r), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      const T sv = s[(row / m) * s_stride + row % m];
      const T* xr = x + row * r;
      T* yr = y + row * r;
      for (int64_t k = 0; k < r; ++k) yr[k] = xr[k] * sv;
    }
  });
}

// out[row] = sum over k of a[row, k] * b[row, k], for rows of r elements:
// the gradient of a broadcast factor, before any sum over the batch. One
// task computes each row in a fixed order: deterministic.
template <typename T>
void RowDots(const T* a, const T* b, T* out, int64_t rows, int64_t r) {
  ParallelFor(rows, std::max<int64_t>(1, kBroadcastGrain / std::max<int64_t>(r, 1)),
              [&](int64_t s, int64_t e) {
                if (r == 1) {
                  for (int64_t i = s; i < e; ++i) out[i] = a[i] * b[i];
                  return;
                }
                for (int64_t i = s; i < e; ++i) out[i] = RowDot(a + i * r, b + i * r, r);
              });
}

}  // namespace cnnflow::cpu
