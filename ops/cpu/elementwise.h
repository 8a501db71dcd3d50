// Small elementwise helpers on host tensors (any float dtype).
#pragma once

#include "ops/tensor.h"

namespace cnnflow {

// y += x (same shape).
void AddInPlace(Tensor& y, const Tensor& x);
// y += alpha * x.
void Axpy(double alpha, const Tensor& x, Tensor& y);
// Sum of squares (for gradient norms and tests).
double SumSquares(const Tensor& x);
// Largest |a - b| over all elements.
double MaxAbsDiff(const Tensor& a, const Tensor& b);

}  // namespace cnnflow
