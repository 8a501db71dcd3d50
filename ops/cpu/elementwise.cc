#include "ops/cpu/elementwise.h"

#include <cmath>

#include "ops/cpu/parallel.h"

namespace cnnflow {

namespace cpu {

void Axpy(double alpha, const Tensor& x, Tensor& y) {
  DispatchFloat(y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = x.data<T>();
    T* ys = y.data<T>();
    const T a = static_cast<T>(alpha);
    ParallelFor(y.numel(), 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ys[i] += a * xs[i];
    });
  });
}

void Scale(Tensor& y, double alpha) {
  DispatchFloat(y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* ys = y.data<T>();
    const T a = static_cast<T>(alpha);
    ParallelFor(y.numel(), 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ys[i] *= a;
    });
  });
}

}  // namespace cpu

double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  CNNFLOW_ENFORCE(a.numel() == b.numel(), "MaxAbsDiff of ", a.shape(), " and ", b.shape());
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.At(i) - b.At(i)));
  return m;
}

}  // namespace cnnflow
