// Small elementwise helpers on host tensors (any float dtype).
#pragma once

#include <cstdint>

#include "ops/tensor.h"

namespace cnnflow {

// Sum of n values over independent lanes, so the compiler vectorises it
// without reassociation flags; the order is fixed, so it is deterministic.
template <typename T>
T RowSum(const T* p, int64_t n) {
  constexpr int kLanes = 16;
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += p[i + l];
  }
  T s = 0;
  for (; i < n; ++i) s += p[i];
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// y += x (same shape).
void AddInPlace(Tensor& y, const Tensor& x);
// y += alpha * x.
void Axpy(double alpha, const Tensor& x, Tensor& y);
// Largest |a - b| over all elements.
double MaxAbsDiff(const Tensor& a, const Tensor& b);

}  // namespace cnnflow
