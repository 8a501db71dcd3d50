#include "ops/layers/layer_norm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/ops/reference_check.h"

namespace cnnflow {
namespace {

using testing::CheckLayer;
using testing::MakeLayer;

// Per (sample, position): the mean and biased variance over the channels.
std::vector<double> NaiveLayerNorm(const std::vector<Tensor>& x, Layer& layer, double eps) {
  const auto* ln = static_cast<LayerNormLayer*>(&layer);
  const int64_t n = x[0].dim(0), c_n = ln->channels(), p_n = x[0].numel() / (n * c_n);
  std::vector<double> y(x[0].numel());
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t p = 0; p < p_n; ++p) {
      auto at = [&](int64_t c) { return (s * c_n + c) * p_n + p; };
      double mean = 0, var = 0;
      for (int64_t c = 0; c < c_n; ++c) mean += x[0].At(at(c));
      mean /= c_n;
      for (int64_t c = 0; c < c_n; ++c) var += (x[0].At(at(c)) - mean) * (x[0].At(at(c)) - mean);
      var /= c_n;
      for (int64_t c = 0; c < c_n; ++c) {
        double v = (x[0].At(at(c)) - mean) / std::sqrt(var + eps);
        if (ln->affine())
          v = v * layer.parameters()[0].value.At(c) + layer.parameters()[1].value.At(c);
        y[at(c)] = v;
      }
    }
  }
  return y;
}

Args Options(double eps, bool affine) {
  Args a;
  a.Set("eps", eps);
  a.Set("affine", affine);
  return a;
}

TEST(LayerNorm, MatchesNaiveAndGradients) {
  for (bool affine : {true, false}) {
    for (const Shape& s : {Shape{2, 5, 3, 4}, Shape{3, 6, 7}, Shape{4, 9}, Shape{1, 7}}) {
      SCOPED_TRACE(StrCat(s, affine ? " affine" : ""));
      CheckLayer(
          "layernorm", Options(1e-6, affine), {s},
          [](const std::vector<Tensor>& x, Layer& l) { return NaiveLayerNorm(x, l, 1e-6); }, 1e-5);
    }
  }
  // More positions than a block (256), more samples than a task.
  CheckLayer(
      "layernorm", Options(1e-5, true), {Shape{3, 16, 20, 20}},
      [](const std::vector<Tensor>& x, Layer& l) { return NaiveLayerNorm(x, l, 1e-5); }, 1e-5,
      false);
  CheckLayer(
      "layernorm", Options(1e-5, true), {Shape{300, 40}},
      [](const std::vector<Tensor>& x, Layer& l) { return NaiveLayerNorm(x, l, 1e-5); }, 1e-5,
      false);
}

TEST(LayerNorm, ParametersAsLayerNorm2d) {
  auto l = MakeLayer("layernorm", {}, {Shape{6, 4, 4}});
  ASSERT_EQ(l->parameters().size(), 2u);
  EXPECT_EQ(l->parameters()[0].name, "weight");
  EXPECT_EQ(l->parameters()[0].value.shape(), (Shape{6}));
  EXPECT_EQ(l->parameters()[0].value.At(5), 1.0);
  EXPECT_EQ(l->parameters()[1].value.At(5), 0.0);
  EXPECT_EQ(static_cast<LayerNormLayer&>(*l).eps(), 1e-6);
  EXPECT_TRUE(MakeLayer("layernorm", Options(1e-6, false), {Shape{6}})->parameters().empty());
}

}  // namespace
}  // namespace cnnflow
