#include "ops/layers/add.h"

#include <gtest/gtest.h>

#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

using testing::CheckGradients;
using testing::MakeLayer;
using testing::RandomTensor;
using testing::RunForward;

TEST(Add, TakesTwoInputs) {
  auto layer = MakeLayer("add", {}, {Shape{3, 4}, Shape{3, 4}});
  EXPECT_EQ(layer->num_inputs(), 2);
  EXPECT_EQ(layer->parameters().size(), 0u);
}

TEST(Add, ForwardMatchesNaive) {
  for (DType dt : {DType::kF32, DType::kF64}) {
    const Shape s{3, 8, 37, 41};  // large enough to be split across tasks
    auto layer = MakeLayer("add", {}, {s.WithoutBatch(), s.WithoutBatch()}, dt);
    Tensor a = RandomTensor(s, 1, -1, 1, dt);
    Tensor b = RandomTensor(s, 2, -1, 1, dt);
    Tensor y = RunForward(*layer, {a, b}, s, {});
    for (int64_t i = 0; i < y.numel(); ++i) {
      const double ref =
          dt == DType::kF32
              ? static_cast<double>(static_cast<float>(a.At(i)) + static_cast<float>(b.At(i)))
              : a.At(i) + b.At(i);
      ASSERT_EQ(y.At(i), ref) << i;
    }
  }
}

TEST(Add, GradientCheck) {
  for (const Shape& s : {Shape{1, 5}, Shape{3, 2, 7}, Shape{2, 3, 3, 5}}) {
    SCOPED_TRACE(s.ToString());
    auto layer = MakeLayer("add", {}, {s.WithoutBatch(), s.WithoutBatch()});
    CheckGradients(*layer, {RandomTensor(s, 3), RandomTensor(s, 4)}, s);
  }
}

TEST(Add, BackwardSkipsMissingInputGradients) {
  auto layer = MakeLayer("add", {}, {Shape{4}, Shape{4}});
  Tensor a = RandomTensor({2, 4}, 1), b = RandomTensor({2, 4}, 2), dy = RandomTensor({2, 4}, 3);
  Tensor y = RunForward(*layer, {a, b}, {2, 4}, {});
  Tensor db = Tensor::Zeros({2, 4}, DType::kF64);
  layer->Backward({&a, &b}, y, dy, {nullptr, &db});
  for (int64_t i = 0; i < dy.numel(); ++i) ASSERT_EQ(db.At(i), dy.At(i));
}

TEST(Add, ShapeMismatchIsShapeError) {
  try {
    MakeLayer("add", {}, {Shape{3, 4}, Shape{3, 5}});
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("inputs must have the same shape"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("[3, 4] and [3, 5]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cnnflow
