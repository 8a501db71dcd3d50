#include "ops/layers/layer_scale.h"

#include <gtest/gtest.h>

#include "ops/model.h"
#include "tests/ops/reference_check.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

using testing::CheckLayer;
using testing::MakeLayer;
using testing::Spec;

// y[n, c, p] = gamma[c] x[n, c, p].
std::vector<double> NaiveLayerScale(const std::vector<Tensor>& x, Layer& layer) {
  const Tensor& gamma = layer.parameters()[0].value;
  const int64_t n = x[0].dim(0), c = gamma.numel(), p = x[0].numel() / (n * c);
  std::vector<double> y;
  for (int64_t i = 0; i < x[0].numel(); ++i) y.push_back(gamma.At((i / p) % c) * x[0].At(i));
  return y;
}

TEST(LayerScale, MatchesNaiveAndGradients) {
  for (const Shape& s : {Shape{2, 3, 4, 5}, Shape{3, 4, 7}, Shape{3, 5}}) {
    SCOPED_TRACE(s.ToString());
    CheckLayer("layer_scale", {}, {s}, NaiveLayerScale, 1e-5);
  }
  CheckLayer("layer_scale", {}, {Shape{32, 24, 14, 14}}, NaiveLayerScale, 1e-5, false);
}

TEST(LayerScale, GammaIsNamedAsTheLayerWithTorchvisionsShape) {
  auto m = Model::Build({Spec("features.1.0.layer_scale", "layer_scale", {{"init", 0.25}}),
                         Spec("head", "linear", {{"out", int64_t{2}}})},
                        Shape{8, 3, 3}, {.seed = 1});
  const auto named = m->NamedParameters();
  ASSERT_EQ(named.size(), 3u);
  EXPECT_EQ(named[0].name, "features.1.0.layer_scale");
  EXPECT_EQ(named[0].param->value.shape(), (Shape{8, 1, 1}));
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(named[0].param->value.At(i), 0.25);
  EXPECT_EQ(named[1].name, "head.weight");
  const auto state = m->StateTensors();
  EXPECT_EQ(state[0].first, "features.1.0.layer_scale");
  EXPECT_EQ(TensorName("a.b", ""), "a.b");
  EXPECT_EQ(TensorName("a.b", "weight"), "a.b.weight");
  // [C, L] -> [C, 1]; [C] -> [C]; the default init is ConvNeXt's 1e-6.
  auto l1 = MakeLayer("layer_scale", {}, {Shape{5, 9}});
  EXPECT_EQ(l1->parameters()[0].value.shape(), (Shape{5, 1}));
  EXPECT_EQ(l1->parameters()[0].value.At(4), 1e-6);
  EXPECT_EQ(MakeLayer("layer_scale", {}, {Shape{5}})->parameters()[0].value.shape(), (Shape{5}));
}

}  // namespace
}  // namespace cnnflow
