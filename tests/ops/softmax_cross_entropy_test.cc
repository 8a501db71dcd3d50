#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ops/loss.h"
#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

using testing::RandomTensor;

Tensor Logits(const std::vector<std::vector<double>>& rows, DType dt = DType::kF64) {
  const int64_t n = static_cast<int64_t>(rows.size()), k = static_cast<int64_t>(rows[0].size());
  Tensor t = Tensor::Empty({n, k}, dt);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) t.Set(i * k + j, rows[i][j]);
  return t;
}

// Naive: mean over rows of -sum_j target_j * log softmax_j.
double NaiveLoss(const Tensor& z, const std::vector<int64_t>& labels, double eps) {
  const int64_t n = z.dim(0), k = z.dim(1);
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    double denom = 0;
    for (int64_t j = 0; j < k; ++j) denom += std::exp(z.At(i * k + j));
    for (int64_t j = 0; j < k; ++j) {
      const double target = (j == labels[i] ? 1 - eps : 0) + eps / static_cast<double>(k);
      total -= target * std::log(std::exp(z.At(i * k + j)) / denom);
    }
  }
  return total / static_cast<double>(n);
}

TEST(SoftmaxCrossEntropy, HandComputedTinyCase) {
  // Row 0: label 2 is the argmax; row 1: label 0 is not.
  Tensor z = Logits({{1, 2, 3}, {1, 2, 3}});
  const std::vector<int64_t> labels = {2, 0};
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));  // 3.40760596
  LossResult r = SoftmaxCrossEntropy(z, labels.data(), nullptr);
  EXPECT_NEAR(r.loss, ((lse - 3) + (lse - 1)) / 2, 1e-12);
  EXPECT_NEAR(r.loss, 1.40760596444438, 1e-12);
  EXPECT_EQ(r.correct, 1);
  // Smoothing 0.1: (1 - 0.1) * nll + 0.1 * mean_j(-log p_j); here mean_j(-log p_j) = lse - 2.
  LossResult s = SoftmaxCrossEntropy(z, labels.data(), nullptr, -1, 0.1);
  EXPECT_NEAR(s.loss, 0.9 * r.loss + 0.1 * (lse - 2), 1e-12);
  // The gradient of the mean: (softmax - onehot) / N.
  Tensor dz = Tensor::Empty({2, 3}, DType::kF64);
  SoftmaxCrossEntropy(z, labels.data(), &dz);
  EXPECT_NEAR(dz.At(2), (std::exp(3 - lse) - 1) / 2, 1e-12);
  EXPECT_NEAR(dz.At(3), (std::exp(1 - lse) - 1) / 2, 1e-12);
  EXPECT_NEAR(dz.At(4), std::exp(2 - lse) / 2, 1e-12);
}

TEST(SoftmaxCrossEntropy, MatchesNaiveReference) {
  for (DType dt : {DType::kF64, DType::kF32}) {
    for (double eps : {0.0, 0.2}) {
      const int64_t n = 7, k = 5;
      Tensor z = RandomTensor({n, k}, 3, -3, 3, dt);
      std::vector<int64_t> labels = {0, 4, 2, 2, 1, 3, 4};
      LossResult r = SoftmaxCrossEntropy(z, labels.data(), nullptr, -1, eps);
      EXPECT_NEAR(r.loss, NaiveLoss(z, labels, eps), 1e-12);
      int64_t correct = 0;
      for (int64_t i = 0; i < n; ++i) {
        int64_t arg = 0;
        for (int64_t j = 1; j < k; ++j)
          if (z.At(i * k + j) > z.At(i * k + arg)) arg = j;
        correct += arg == labels[i];
      }
      EXPECT_EQ(r.correct, correct);
    }
  }
}

TEST(SoftmaxCrossEntropy, GradientMatchesFiniteDifferences) {
  struct Case {
    int64_t n, k;
    double eps;
  };
  for (const Case& c : {Case{1, 2, 0}, Case{3, 5, 0}, Case{4, 7, 0.1}, Case{1, 10, 0.3}}) {
    SCOPED_TRACE(c.n * 100 + c.k);
    Tensor z = RandomTensor({c.n, c.k}, 11, -2, 2);
    std::vector<int64_t> labels;
    for (int64_t i = 0; i < c.n; ++i) labels.push_back((i * 3 + 1) % c.k);
    Tensor dz = Tensor::Empty(z.shape(), DType::kF64);
    SoftmaxCrossEntropy(z, labels.data(), &dz, -1, c.eps);
    const double h = 1e-5;
    for (int64_t i = 0; i < z.numel(); ++i) {
      const double orig = z.At(i);
      z.Set(i, orig + h);
      const double lp = SoftmaxCrossEntropy(z, labels.data(), nullptr, -1, c.eps).loss;
      z.Set(i, orig - h);
      const double lm = SoftmaxCrossEntropy(z, labels.data(), nullptr, -1, c.eps).loss;
      z.Set(i, orig);
      EXPECT_NEAR(dz.At(i), (lp - lm) / (2 * h), 1e-8) << i;
    }
  }
}

// Mixed targets (mixup, cutmix) against the naive loss on the explicit
// target w * onehot(a) + (1 - w) * onehot(b), smoothed; the gradient by
// finite differences; and the correct count by the larger weight.
TEST(SoftmaxCrossEntropy, MixedTargetsMatchTheNaiveSoftTargetLoss) {
  const int64_t n = 6, k = 5;
  Tensor z = RandomTensor({n, k}, 21, -3, 3);
  const std::vector<int64_t> a = {0, 4, 2, 2, 1, 3}, b = {1, 1, 2, 0, 4, 3};
  const std::vector<float> w = {0.7f, 0.25f, 0.5f, 1.0f, 0.0f, 0.6f};
  const LabelMix mix{b.data(), w.data()};
  for (double eps : {0.0, 0.1}) {
    double want = 0;
    for (int64_t i = 0; i < n; ++i) {
      double denom = 0;
      for (int64_t j = 0; j < k; ++j) denom += std::exp(z.At(i * k + j));
      for (int64_t j = 0; j < k; ++j) {
        const double t = (1 - eps) * ((j == a[i] ? w[i] : 0.0) + (j == b[i] ? 1.0 - w[i] : 0.0)) +
                         eps / static_cast<double>(k);
        want -= t * std::log(std::exp(z.At(i * k + j)) / denom);
      }
    }
    const LossResult r = SoftmaxCrossEntropy(z, a.data(), nullptr, -1, eps, &mix);
    EXPECT_NEAR(r.loss, want / n, 1e-12) << eps;
    int64_t correct = 0;
    for (int64_t i = 0; i < n; ++i) {
      int64_t arg = 0;
      for (int64_t j = 1; j < k; ++j)
        if (z.At(i * k + j) > z.At(i * k + arg)) arg = j;
      correct += arg == (1.0 - w[i] > 0.5 ? b[i] : a[i]);
    }
    EXPECT_EQ(r.correct, correct);
    Tensor dz = Tensor::Empty(z.shape(), DType::kF64);
    SoftmaxCrossEntropy(z, a.data(), &dz, -1, eps, &mix);
    const double h = 1e-5;
    for (int64_t i = 0; i < z.numel(); ++i) {
      const double orig = z.At(i);
      z.Set(i, orig + h);
      const double lp = SoftmaxCrossEntropy(z, a.data(), nullptr, -1, eps, &mix).loss;
      z.Set(i, orig - h);
      const double lm = SoftmaxCrossEntropy(z, a.data(), nullptr, -1, eps, &mix).loss;
      z.Set(i, orig);
      EXPECT_NEAR(dz.At(i), (lp - lm) / (2 * h), 1e-8) << i;
    }
  }
  // Weight 1 everywhere is the plain loss.
  const std::vector<float> ones(n, 1.0f);
  const LabelMix none{b.data(), ones.data()};
  EXPECT_NEAR(SoftmaxCrossEntropy(z, a.data(), nullptr, -1, 0, &none).loss,
              SoftmaxCrossEntropy(z, a.data(), nullptr).loss, 1e-15);
  const std::vector<int64_t> bad = {0, 9, 0, 0, 0, 0};
  const LabelMix out{bad.data(), w.data()};
  EXPECT_THROW(SoftmaxCrossEntropy(z, a.data(), nullptr, -1, 0, &out), Error);
}

TEST(SoftmaxCrossEntropy, GradScale) {
  Tensor z = RandomTensor({4, 3}, 2);
  std::vector<int64_t> labels = {0, 1, 2, 1};
  Tensor mean_grad = Tensor::Empty({4, 3}, DType::kF64);
  Tensor scaled = Tensor::Empty({4, 3}, DType::kF64);
  SoftmaxCrossEntropy(z, labels.data(), &mean_grad);
  // A replica holding 4 of a global batch of 16 scales by 1/16.
  SoftmaxCrossEntropy(z, labels.data(), &scaled, 1.0 / 16);
  for (int64_t i = 0; i < z.numel(); ++i) EXPECT_NEAR(scaled.At(i), mean_grad.At(i) / 4, 1e-15);
}

TEST(SoftmaxCrossEntropy, NumericallyStableForLargeLogits) {
  for (DType dt : {DType::kF32, DType::kF64}) {
    Tensor z = Logits({{1000, 1001, 999}, {-1000, -1002, -1001}}, dt);
    std::vector<int64_t> labels = {1, 0};
    Tensor dz = Tensor::Empty({2, 3}, dt);
    LossResult r = SoftmaxCrossEntropy(z, labels.data(), &dz);
    const double lse = std::log(std::exp(-1.0) + 1 + std::exp(-2.0));  // shifted
    EXPECT_NEAR(r.loss, lse, 1e-6);
    EXPECT_EQ(r.correct, 2);
    for (int64_t i = 0; i < dz.numel(); ++i) EXPECT_TRUE(std::isfinite(dz.At(i)));
  }
}

TEST(SoftmaxCrossEntropy, ResultsDoNotDependOnThreadCount) {
  const int64_t n = 5000, k = 10;
  Tensor z = RandomTensor({n, k}, 4, -3, 3, DType::kF32);
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = (i * 7) % k;
  auto run = [&](int threads) {
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, threads);
    Tensor dz = Tensor::Empty({n, k}, DType::kF32);
    LossResult r = SoftmaxCrossEntropy(z, labels.data(), &dz);
    return std::make_pair(r, dz);
  };
  auto [r1, d1] = run(1);
  auto [r2, d2] = run(2);
  EXPECT_EQ(r1.loss, r2.loss);
  EXPECT_EQ(r1.correct, r2.correct);
  EXPECT_EQ(std::memcmp(d1.raw_data(), d2.raw_data(), d1.nbytes()), 0);
  EXPECT_NEAR(r1.loss, NaiveLoss(z, labels, 0), 1e-9);
}

TEST(SoftmaxCrossEntropy, LabelOutOfRangeIsError) {
  Tensor z = RandomTensor({3, 10}, 1);
  for (int64_t bad : {int64_t{10}, int64_t{-1}}) {
    std::vector<int64_t> labels = {3, bad, 0};
    try {
      SoftmaxCrossEntropy(z, labels.data(), nullptr);
      FAIL() << "no error for " << bad;
    } catch (const Error& e) {
      EXPECT_NE(
          std::string(e.what()).find(StrCat("label ", bad, " at index 1 is out of range [0, 10)")),
          std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(SoftmaxCrossEntropy(Tensor::Zeros({2, 3, 4}, DType::kF64), nullptr, nullptr),
               ShapeError);
}

}  // namespace
}  // namespace cnnflow
