#include "ops/train/whitening.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/error.h"

namespace cnnflow {

SymmetricEigen EigenSymmetric(std::vector<double> a, int d) {
  CNNFLOW_ENFORCE(static_cast<int64_t>(a.size()) == int64_t{d} * d, "eigen: not a ", d, "x", d,
                  " matrix");
  std::vector<double> v(static_cast<size_t>(d) * d, 0.0);  // columns: the eigenvectors
  for (int i = 0; i < d; ++i) v[i * d + i] = 1;
  auto at = [d](std::vector<double>& m, int r, int c) -> double& { return m[r * d + c]; };
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0, norm = 0;
    for (int r = 0; r < d; ++r)
      for (int c = 0; c < d; ++c) (r == c ? norm : off) += at(a, r, c) * at(a, r, c);
    if (off <= 1e-30 * (norm + off) || off == 0) break;
    for (int p = 0; p < d; ++p) {
      for (int q = p + 1; q < d; ++q) {
        const double apq = at(a, p, q);
        if (apq == 0) continue;
        // The rotation that zeroes a[p][q] (Golub & Van Loan, 8.4).
        const double theta = (at(a, q, q) - at(a, p, p)) / (2 * apq);
        const double t =
            (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double cs = 1 / std::sqrt(t * t + 1), sn = t * cs;
        for (int k = 0; k < d; ++k) {  // a = a J
          const double akp = at(a, k, p), akq = at(a, k, q);
          at(a, k, p) = cs * akp - sn * akq;
          at(a, k, q) = sn * akp + cs * akq;
        }
        for (int k = 0; k < d; ++k) {  // a = J^T a
          const double apk = at(a, p, k), aqk = at(a, q, k);
          at(a, p, k) = cs * apk - sn * aqk;
          at(a, q, k) = sn * apk + cs * aqk;
        }
        for (int k = 0; k < d; ++k) {  // v = v J
          const double vkp = at(v, k, p), vkq = at(v, k, q);
          at(v, k, p) = cs * vkp - sn * vkq;
          at(v, k, q) = sn * vkp + cs * vkq;
        }
      }
    }
  }
  std::vector<int> order(d);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int x, int y) { return at(a, x, x) > at(a, y, y); });
  SymmetricEigen e;
  for (int i = 0; i < d; ++i) {
    e.values.push_back(at(a, order[i], order[i]));
    for (int k = 0; k < d; ++k) e.vectors.push_back(at(v, k, order[i]));
  }
  return e;
}

PatchCovariance::PatchCovariance(int channels, int kh, int kw)
    : c_(channels),
      kh_(kh),
      kw_(kw),
      d_(channels * kh * kw),
      sum_(static_cast<size_t>(d_) * d_, 0.0) {}

void PatchCovariance::Add(const float* image, int h, int w) {
  std::vector<double> p(d_);
  for (int y = 0; y + kh_ <= h; ++y) {
    for (int x = 0; x + kw_ <= w; ++x) {
      int j = 0;
      for (int c = 0; c < c_; ++c)
        for (int dy = 0; dy < kh_; ++dy)
          for (int dx = 0; dx < kw_; ++dx) p[j++] = image[(int64_t{c} * h + y + dy) * w + x + dx];
      for (int r = 0; r < d_; ++r)
        for (int s = r; s < d_; ++s) sum_[r * d_ + s] += p[r] * p[s];
      ++n_;
    }
  }
}

std::vector<double> PatchCovariance::Covariance() const {
  std::vector<double> cov(sum_.size());
  for (int r = 0; r < d_; ++r)
    for (int s = r; s < d_; ++s)
      cov[r * d_ + s] = cov[s * d_ + r] =
          sum_[r * d_ + s] / static_cast<double>(std::max<int64_t>(n_, 1));
  return cov;
}

Tensor WhiteningWeight(const PatchCovariance& cov, int64_t out, int channels, int kh, int kw,
                       double eps) {
  const int d = cov.dim();
  if (out != d && out != 2 * d) {
    throw ConfigError(StrCat("a ", kh, "x", kw, " conv over ", channels, " channels whitens ", d,
                             " patch values: it needs ", d, " or ", 2 * d,
                             " output channels (the filters, and their negations), not ", out));
  }
  if (cov.patches() == 0) throw ConfigError("the images have no patch of that size");
  const SymmetricEigen e = EigenSymmetric(cov.Covariance(), d);
  Tensor w = Tensor::Empty(Shape{out, channels, kh, kw}, DType::kF32);
  for (int64_t o = 0; o < out; ++o) {
    const int i = static_cast<int>(o % d);
    const double scale = (o < d ? 1.0 : -1.0) / std::sqrt(std::max(e.values[i], 0.0) + eps);
    for (int k = 0; k < d; ++k) w.Set(o * d + k, e.vectors[i * d + k] * scale);
  }
  return w;
}

}  // namespace cnnflow
