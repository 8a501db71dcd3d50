#include "ops/layers/group_norm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/ops/reference_check.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

using testing::CheckLayer;
using testing::ErrorOf;
using testing::ExpectContains;
using testing::MakeLayer;

// Per (sample, group): the mean and biased variance over the group's
// channels and positions.
std::vector<double> NaiveGroupNorm(const std::vector<Tensor>& x, Layer& layer) {
  const auto& gn = static_cast<GroupNormLayer&>(layer);
  const int64_t n = x[0].dim(0), c_n = gn.channels(), g_n = gn.groups();
  const int64_t p_n = x[0].numel() / (n * c_n), cg = c_n / g_n;
  std::vector<double> y(x[0].numel());
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t g = 0; g < g_n; ++g) {
      double mean = 0, var = 0;
      const int64_t first = (s * c_n + g * cg) * p_n, count = cg * p_n;
      for (int64_t i = 0; i < count; ++i) mean += x[0].At(first + i);
      mean /= count;
      for (int64_t i = 0; i < count; ++i) var += std::pow(x[0].At(first + i) - mean, 2);
      var /= count;
      for (int64_t i = 0; i < count; ++i) {
        const int64_t c = g * cg + i / p_n;
        double v = (x[0].At(first + i) - mean) / std::sqrt(var + gn.eps());
        if (gn.affine()) {
          v = v * layer.parameters()[0].value.At(c) + layer.parameters()[1].value.At(c);
        }
        y[first + i] = v;
      }
    }
  }
  return y;
}

Args Groups(int64_t g, bool affine = true, double eps = 1e-5) {
  Args a;
  a.Set("groups", g);
  a.Set("affine", affine);
  a.Set("eps", eps);
  return a;
}

TEST(GroupNorm, MatchesNaiveAndGradients) {
  for (bool affine : {true, false}) {
    SCOPED_TRACE(affine ? "affine" : "no affine");
    CheckLayer("groupnorm", Groups(3, affine), {Shape{2, 6, 3, 4}}, NaiveGroupNorm, 1e-5);
    CheckLayer("groupnorm", Groups(2, affine, 1e-3), {Shape{3, 4, 7}}, NaiveGroupNorm, 1e-5);
    CheckLayer("groupnorm", Groups(3, affine), {Shape{2, 6}}, NaiveGroupNorm, 1e-5);
    CheckLayer("groupnorm", Groups(1, affine), {Shape{2, 4, 3, 3}}, NaiveGroupNorm, 1e-5);
    CheckLayer("groupnorm", Groups(4, affine), {Shape{2, 4, 3, 3}}, NaiveGroupNorm, 1e-5);
  }
  CheckLayer("groupnorm", Groups(8), {Shape{16, 32, 16, 16}}, NaiveGroupNorm, 1e-5, false);
}

TEST(GroupNorm, GroupsMustDivideChannels) {
  ExpectContains(ErrorOf<ShapeError>([] {
                   MakeLayer("groupnorm", Groups(4), {Shape{6, 3, 3}});
                 }),
                 {"C divisible by 4", "[6, 3, 3]"});
  ExpectContains(ErrorOf<ConfigError>([] { MakeLayer("groupnorm", Groups(0), {Shape{6}}); }),
                 {"groupnorm 'groupnorm0': groups must be >= 1"});
}

}  // namespace
}  // namespace cnnflow
