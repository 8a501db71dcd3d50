// A data-dependent init for a first convolution (the CIFAR speed runs'
// frozen "whitening" layer): its filters are the eigenvectors of the
// uncentred covariance of the training images' k x k patches, largest
// eigenvalue first, each divided by sqrt(eigenvalue + eps), so the layer's
// outputs are decorrelated with unit variance where the data has any; with
// twice as many filters as patch values, the negated filters follow.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/tensor.h"

namespace cnnflow {

// The symmetric d x d matrix a (row-major, f64) as eigenvalues (descending)
// and eigenvectors (row i: the vector of eigenvalue i), by cyclic Jacobi.
struct SymmetricEigen {
  std::vector<double> values;
  std::vector<double> vectors;  // d x d, row-major
};
SymmetricEigen EigenSymmetric(std::vector<double> a, int d);

// Accumulates the uncentred covariance of every stride-1 kh x kw patch of
// images [C, H, W] (f32, contiguous), patch values in (c, y, x) order.
class PatchCovariance {
 public:
  PatchCovariance(int channels, int kh, int kw);
  void Add(const float* image, int h, int w);
  int64_t patches() const { return n_; }
  int dim() const { return d_; }
  // sum / patches, d x d.
  std::vector<double> Covariance() const;

 private:
  int c_, kh_, kw_, d_;
  int64_t n_ = 0;
  std::vector<double> sum_;
};

// The conv weight [out, C, kh, kw] (f32) whitening that covariance: out is
// d (the eigenvectors) or 2d (and their negations). Throws ConfigError for
// another out.
Tensor WhiteningWeight(const PatchCovariance& cov, int64_t out, int channels, int kh, int kw,
                       double eps);

}  // namespace cnnflow
