// The whitening init (ops/train/whitening.h): Jacobi's eigenpairs against
// their definition, and the filters against what they are for: on the
// patches they were computed from, W C W^T = diag(lambda / (lambda + eps)).
#include "ops/train/whitening.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/random.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

TEST(Whitening, EigenpairsSatisfyTheirDefinition) {
  const int d = 12;
  Rng rng(3);
  std::vector<double> b(d * d), a(d * d, 0.0);
  for (double& x : b) x = rng.Normal(0, 1);
  for (int i = 0; i < d; ++i)  // a = b b^T: symmetric, positive semi-definite
    for (int j = 0; j < d; ++j)
      for (int k = 0; k < d; ++k) a[i * d + j] += b[i * d + k] * b[j * d + k];
  const SymmetricEigen e = EigenSymmetric(a, d);
  ASSERT_EQ(e.values.size(), size_t{d});
  for (int i = 0; i < d; ++i) {
    if (i > 0) {
      EXPECT_GE(e.values[i - 1], e.values[i]);
    }
    for (int r = 0; r < d; ++r) {  // (A v)_r = lambda v_r
      double av = 0;
      for (int k = 0; k < d; ++k) av += a[r * d + k] * e.vectors[i * d + k];
      EXPECT_NEAR(av, e.values[i] * e.vectors[i * d + r], 1e-9 * (1 + std::fabs(e.values[0])));
    }
    for (int j = 0; j < d; ++j) {  // orthonormal
      double dot = 0;
      for (int k = 0; k < d; ++k) dot += e.vectors[i * d + k] * e.vectors[j * d + k];
      EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-12);
    }
  }
}

TEST(Whitening, FiltersDecorrelateThePatchesTheyCameFrom) {
  // Correlated 3-channel 8x8 images: a smooth field plus noise.
  const int c = 3, h = 8, w = 8, kh = 2, kw = 2, d = c * kh * kw;
  Rng rng(5);
  std::vector<std::vector<float>> images(200, std::vector<float>(c * h * w));
  PatchCovariance cov(c, kh, kw);
  for (auto& im : images) {
    const double a = rng.Normal(0, 1), b = rng.Normal(0, 1);
    for (int ch = 0; ch < c; ++ch)
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
          im[(ch * h + y) * w + x] =
              static_cast<float>(a * std::sin(0.3 * x + ch) + b * 0.1 * y + 0.2 * rng.Normal(0, 1));
    cov.Add(im.data(), h, w);
  }
  EXPECT_EQ(cov.patches(), 200 * 7 * 7);
  const double eps = 5e-4;
  const Tensor wt = WhiteningWeight(cov, 2 * d, c, kh, kw, eps);
  ASSERT_EQ(wt.shape(), (Shape{2 * d, c, kh, kw}));
  const std::vector<double> cv = cov.Covariance();
  const SymmetricEigen e = EigenSymmetric(cv, d);
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) {  // (W C W^T)_ij
      double s = 0;
      for (int r = 0; r < d; ++r)
        for (int q = 0; q < d; ++q) s += wt.At(i * d + r) * cv[r * d + q] * wt.At(j * d + q);
      const double want = i == j ? e.values[i] / (e.values[i] + eps) : 0.0;
      EXPECT_NEAR(s, want, 1e-4) << i << ", " << j;
    }
    for (int k = 0; k < d; ++k) EXPECT_EQ(wt.At((d + i) * d + k), -wt.At(i * d + k));
  }
  testing::ExpectContains(
      testing::ErrorOf<ConfigError>([&] { WhiteningWeight(cov, 16, c, kh, kw, eps); }),
      {"needs 12 or 24 output channels", "not 16"});
}

}  // namespace
}  // namespace cnnflow
