#include "ops/cpu/elementwise.h"

#include <cmath>

#include "ops/cpu/parallel.h"
#include "ops/cuda/kernels.h"

namespace cnnflow {

void AddInPlace(Tensor& y, const Tensor& x) { Axpy(1.0, x, y); }

void Axpy(double alpha, const Tensor& x, Tensor& y) {
  CNNFLOW_ENFORCE(x.shape() == y.shape() && x.dtype() == y.dtype() && x.device() == y.device(),
                  "Axpy of ", x.shape(), " into ", y.shape());
  if (y.device().is_cuda()) return cuda::Axpy(static_cast<float>(alpha), x, y);
  DispatchFloat(y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = x.data<T>();
    T* ys = y.data<T>();
    const T a = static_cast<T>(alpha);
    cpu::ParallelFor(y.numel(), 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ys[i] += a * xs[i];
    });
  });
}

void ScaleInPlace(Tensor& y, double alpha) {
  if (y.device().is_cuda()) return cuda::Scale(y, static_cast<float>(alpha));
  DispatchFloat(y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* ys = y.data<T>();
    const T a = static_cast<T>(alpha);
    cpu::ParallelFor(y.numel(), 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ys[i] *= a;
    });
  });
}

double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  CNNFLOW_ENFORCE(a.numel() == b.numel(), "MaxAbsDiff of ", a.shape(), " and ", b.shape());
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.At(i) - b.At(i)));
  return m;
}

}  // namespace cnnflow
