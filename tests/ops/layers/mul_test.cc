#include "ops/layers/mul.h"

#include <gtest/gtest.h>

#include "ops/model.h"
#include "tests/ops/reference_check.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

using testing::CheckLayer;
using testing::ErrorOf;
using testing::ExpectContains;
using testing::MakeLayer;
using testing::Spec;

// y[n, i] = x[n, i] * s[n, i / (size of x / size of s)]: s's elements each
// cover a contiguous run of x's (the trailing dimensions).
std::vector<double> NaiveMul(const std::vector<Tensor>& x, Layer&) {
  const int64_t n = x[0].dim(0), per_x = x[0].numel() / n, per_s = x[1].numel() / n;
  std::vector<double> y;
  for (int64_t s = 0; s < n; ++s)
    for (int64_t i = 0; i < per_x; ++i)
      y.push_back(x[0].At(s * per_x + i) * x[1].At(s * per_s + i / (per_x / per_s)));
  return y;
}

Args Scale(double a) {
  Args args;
  args.Set("scale", std::vector<double>{a});
  return args;
}

TEST(Mul, TwoInputsMatchNaiveAndGradients) {
  // Same shape; squeeze-excitation gates [C, 1, 1] and [C]; a [C, H, 1]
  // factor; 1D [C, 1] and [C]; a factor per sample [1, 1].
  for (const auto& [x, s] : std::vector<std::pair<Shape, Shape>>{{{2, 3, 4, 5}, {2, 3, 4, 5}},
                                                                 {{2, 3, 4, 5}, {2, 3, 1, 1}},
                                                                 {{2, 3, 4, 5}, {2, 3}},
                                                                 {{2, 3, 4, 5}, {2, 3, 4, 1}},
                                                                 {{3, 4, 7}, {3, 4, 1}},
                                                                 {{3, 4, 7}, {3, 4}},
                                                                 {{3, 4, 7}, {3, 1, 1}},
                                                                 {{3, 6}, {3, 6}}}) {
    SCOPED_TRACE(StrCat("x ", x, " s ", s));
    CheckLayer("mul", {}, {x, s}, NaiveMul, 1e-5);
  }
  CheckLayer("mul", {}, {Shape{64, 32, 17, 17}, Shape{64, 32}}, NaiveMul, 1e-5, false);
}

TEST(Mul, ScaleMatchesNaiveAndGradients) {
  for (const Shape& x : {Shape{2, 3, 4, 5}, Shape{3, 7}, Shape{40, 16, 30, 30}}) {
    CheckLayer(
        "mul", Scale(1.0 / 9), {x},
        [](const std::vector<Tensor>& in, Layer&) {
          std::vector<double> y;
          for (int64_t i = 0; i < in[0].numel(); ++i) y.push_back(in[0].At(i) / 9);
          return y;
        },
        1e-6, x.numel() < 1000);
  }
}

TEST(Mul, InputCountDependsOnScale) {
  EXPECT_EQ(MakeLayer("mul", {}, {Shape{3}, Shape{3}})->num_inputs(), 2);
  EXPECT_EQ(MakeLayer("mul", Scale(2), {Shape{3}})->num_inputs(), 1);
  ExpectContains(
      ErrorOf<ConfigError>([] {
        Model::Build({Spec("m", "mul", {{"scale", std::vector<double>{0.5}}}, {"input", "input"})},
                     Shape{3}, {.seed = 1});
      }),
      {"takes 1 input(s), got 2"});
  ExpectContains(
      ErrorOf<ConfigError>([] { Model::Build({Spec("m", "mul")}, Shape{3}, {.seed = 1}); }),
      {"takes 2 input(s), got 1"});
  Args two;
  two.Set("scale", std::vector<double>{1, 2});
  ExpectContains(ErrorOf<ConfigError>([&] { MakeLayer("mul", two, {Shape{3}}); }),
                 {"scale is one number"});
}

TEST(Mul, FactorMustBroadcastOverTrailingDimensions) {
  for (const auto& [x, s] : std::vector<std::pair<Shape, Shape>>{{{3, 4, 5}, {4, 1, 1}},
                                                                 {{3, 4, 5}, {3, 4, 5, 1}},
                                                                 {{3, 4, 5}, {1, 4, 5}},
                                                                 {{3, 4, 5}, {3, 5}}}) {
    ExpectContains(ErrorOf<ShapeError>([&] {
                     MakeLayer("mul", {}, {x, s});
                   }),
                   {"broadcast over x's trailing", StrCat("x ", x, " and s ", s)});
  }
}

}  // namespace
}  // namespace cnnflow
