#include "ops/layers/channel_linear.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/ops/reference_check.h"

namespace cnnflow {
namespace {

using testing::CheckLayer;
using testing::MakeLayer;

// y[n, k, p] = sum_c W[k, c] x[n, c, p] + b[k].
std::vector<double> NaiveChannelLinear(const std::vector<Tensor>& x, Layer& layer) {
  const Tensor& w = layer.parameters()[0].value;
  const bool bias = layer.parameters().size() > 1;
  const int64_t n = x[0].dim(0), k_out = w.dim(0), c_in = w.dim(1);
  const int64_t p = x[0].numel() / (n * c_in);
  std::vector<double> y;
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t k = 0; k < k_out; ++k) {
      for (int64_t q = 0; q < p; ++q) {
        double v = bias ? layer.parameters()[1].value.At(k) : 0.0;
        for (int64_t c = 0; c < c_in; ++c)
          v += w.At(k * c_in + c) * x[0].At((s * c_in + c) * p + q);
        y.push_back(v);
      }
    }
  }
  return y;
}

Args Out(int64_t k, bool bias = true) {
  Args a;
  a.Set("out", k);
  a.Set("bias", bias);
  return a;
}

TEST(ChannelLinear, MatchesNaiveAndGradients) {
  for (bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    CheckLayer("channel_linear", Out(6, bias), {Shape{2, 3, 4, 5}}, NaiveChannelLinear, 1e-5);
    CheckLayer("channel_linear", Out(2, bias), {Shape{3, 4, 7}}, NaiveChannelLinear, 1e-5);
    CheckLayer("channel_linear", Out(4, bias), {Shape{3, 5}}, NaiveChannelLinear, 1e-5);
  }
  // Several backward chunks, each summing its own dW.
  CheckLayer("channel_linear", Out(24), {Shape{40, 16, 10, 10}}, NaiveChannelLinear, 1e-5, false);
}

TEST(ChannelLinear, ShapesAndInitAsNnLinear) {
  auto l = MakeLayer("channel_linear", Out(12), {Shape{8, 5, 5}});
  ASSERT_EQ(l->parameters().size(), 2u);
  EXPECT_EQ(l->parameters()[0].value.shape(), (Shape{12, 8}));
  EXPECT_EQ(l->parameters()[1].value.shape(), (Shape{12}));
  const double bound = 1 / std::sqrt(8.0);
  double most = 0;
  for (const auto& p : l->parameters())
    for (int64_t i = 0; i < p.value.numel(); ++i) most = std::max(most, std::abs(p.value.At(i)));
  EXPECT_LE(most, bound);
  EXPECT_GT(most, 0.8 * bound);
  EXPECT_EQ(l->ForwardFlops(2), 2 * 2 * 8 * 12 * 25);
}

}  // namespace
}  // namespace cnnflow
