#include "ops/layers/concat.h"

#include <gtest/gtest.h>

#include "ops/model.h"
#include "ops/parallel/pipeline_model.h"
#include "ops/train/optimizer.h"
#include "tests/ops/reference_check.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

using testing::CheckLayer;
using testing::ErrorOf;
using testing::ExpectContains;
using testing::MakeLayer;
using testing::Spec;

// torch.cat(x, dim=1), element by element.
std::vector<double> NaiveConcat(const std::vector<Tensor>& x, Layer&) {
  const int64_t n = x[0].dim(0);
  std::vector<double> y;
  for (int64_t s = 0; s < n; ++s) {
    for (const Tensor& t : x) {
      const int64_t per = t.numel() / n;
      for (int64_t i = 0; i < per; ++i) y.push_back(t.At(s * per + i));
    }
  }
  return y;
}

TEST(Concat, MatchesNaiveAndGradients) {
  CheckLayer("concat", {}, {Shape{2, 3, 4, 5}, Shape{2, 1, 4, 5}, Shape{2, 2, 4, 5}}, NaiveConcat,
             1e-7);
  CheckLayer("concat", {}, {Shape{3, 3, 7}, Shape{3, 5, 7}}, NaiveConcat, 1e-7);
  CheckLayer("concat", {}, {Shape{3, 4}, Shape{3, 2}, Shape{3, 1}, Shape{3, 6}}, NaiveConcat, 1e-7);
  // Many samples: split across tasks.
  CheckLayer("concat", {}, {Shape{300, 8, 9, 9}, Shape{300, 4, 9, 9}}, NaiveConcat, 1e-7, false);
}

TEST(Concat, BackwardSkipsMissingGradients) {
  auto layer = MakeLayer("concat", {}, {Shape{2, 3}, Shape{1, 3}});
  Tensor a = testing::RandomTensor({2, 2, 3}, 1), b = testing::RandomTensor({2, 1, 3}, 2);
  Tensor dy = testing::RandomTensor({2, 3, 3}, 3);
  Tensor db = Tensor::Zeros({2, 1, 3}, DType::kF64);
  layer->Backward({&a, &b}, dy, dy, {nullptr, &db});
  for (int64_t s = 0; s < 2; ++s)
    for (int64_t i = 0; i < 3; ++i) ASSERT_EQ(db.At(s * 3 + i), dy.At(s * 9 + 6 + i));
}

TEST(Concat, OtherDimensionsMustAgree) {
  const std::string e = ErrorOf<ShapeError>([] {
    MakeLayer("concat", {}, {Shape{3, 4, 5}, Shape{2, 4, 6}});
  });
  ExpectContains(e, {"along channels", "[3, 4, 5], [2, 4, 6]"});
  ExpectContains(ErrorOf<ShapeError>([] {
                   MakeLayer("concat", {}, {Shape{3, 4}, Shape{3}});
                 }),
                 {"[3, 4], [3]"});
}

TEST(Concat, ModelTakesAnyNumberOfInputsFromTwo) {
  auto m = Model::Build(
      {Spec("a", "relu"), Spec("b", "relu"), Spec("cat", "concat", {}, {"a", "input", "b"})},
      Shape{2, 3, 3}, {.seed = 1});
  EXPECT_EQ(m->output_shape(), (Shape{6, 3, 3}));
  EXPECT_EQ(m->layer(2).num_inputs(), kVariadicInputs);
  ExpectContains(
      ErrorOf<ConfigError>([] {
        Model::Build({Spec("a", "relu"), Spec("cat", "concat")}, Shape{2, 3}, {.seed = 1});
      }),
      {"layer 'cat' (concat) takes 2 or more input(s), got 1"});
  // A shape mismatch names the layers it came from.
  ExpectContains(ErrorOf<ShapeError>([] {
                   Model::Build({Spec("fc", "linear", {{"out", int64_t{4}}}),
                                 Spec("cat", "concat", {}, {"fc", "input"})},
                                Shape{2, 3}, {.seed = 1});
                 }),
                 {"'fc' (linear) produces [4]", "the model input produces [2, 3]"});
}

TEST(Concat, FirstLayerOfAPipelineStageReadsTheStageInputTwice) {
  const std::vector<LayerSpec> net = {
      Spec("fc1", "linear", {{"out", int64_t{4}}}),
      Spec("cat", "concat", {}, {"fc1", "fc1"}),
      Spec("fc2", "linear", {{"out", int64_t{3}}}),
  };
  PipelineOptions o;
  o.stages = {{"fc1"}, {"cat", "fc2"}};
  Args sgd;
  sgd.Set("lr", 0.1);
  sgd.FillDefaults(OptimizerSchema("sgd"));
  PipelineModel p(net, Shape{5}, 1, InitScheme::kPytorchDefault, {"sgd", sgd}, o);
  EXPECT_EQ(p.stage_model(1).inputs_of(0), (std::vector<std::string>{"input", "input"}));
  EXPECT_EQ(p.stage_model(1).output_shape(1), (Shape{3}));
}

}  // namespace
}  // namespace cnnflow
