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

// sum of a[i] * b[i], in RowSum's fixed lane order.
template <typename T>
T RowDot(const T* a, const T* b, int64_t n) {
  constexpr int kLanes = 16;
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  }
  T s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// sum of (p[i] - mean)^2 (the second pass of a two-pass variance).
template <typename T>
T RowSquaredDeviation(const T* p, int64_t n, T mean) {
  constexpr int kLanes = 16;
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const T d = p[i + l] - mean;
      acc[l] += d * d;
    }
  }
  T s = 0;
  for (; i < n; ++i) s += (p[i] - mean) * (p[i] - mean);
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// p[i] = max(p[i], 0): a ReLU fused into the layer that wrote p.
template <typename T>
void ReluInPlace(T* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = p[i] > T(0) ? p[i] : T(0);
}

// out[i] = y[i] > 0 ? dy[i] : 0: the gradient through a fused ReLU whose
// output is y (out may be dy).
template <typename T>
void ReluMask(const T* y, const T* dy, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T g = dy[i];  // both loads unconditional, so it vectorises
    out[i] = y[i] > T(0) ? g : T(0);
  }
}

namespace cpu {
// y += alpha * x; y *= alpha, on host tensors (ops/device_ops.h's, any device).
void Axpy(double alpha, const Tensor& x, Tensor& y);
void Scale(Tensor& y, double alpha);
}  // namespace cpu
// Largest |a - b| over all elements.
double MaxAbsDiff(const Tensor& a, const Tensor& b);

}  // namespace cnnflow
