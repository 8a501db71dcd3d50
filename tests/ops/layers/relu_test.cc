#include "ops/layers/relu.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

using testing::CheckGradients;
using testing::MakeLayer;
using testing::RandomTensor;
using testing::RunForward;

// Values in (-1, 1) kept at least 0.05 away from the kink at 0.
Tensor AwayFromZero(const Shape& shape, uint64_t seed, DType dtype = DType::kF64) {
  Tensor t = RandomTensor(shape, seed, -1, 1, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = t.At(i);
    if (std::abs(v) < 0.05) t.Set(i, v < 0 ? v - 0.05 : v + 0.05);
  }
  return t;
}

TEST(Relu, ForwardMatchesNaive) {
  for (DType dt : {DType::kF32, DType::kF64}) {
    // Large enough to be split across tasks.
    const Shape s{3, 5, 67, 67};
    auto layer = MakeLayer("relu", {}, {s.WithoutBatch()}, dt);
    Tensor x = RandomTensor(s, 4, -1, 1, dt);
    Tensor y = RunForward(*layer, {x}, s, {});
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double ref = x.At(i) > 0 ? x.At(i) : 0.0;
      ASSERT_EQ(y.At(i), ref) << i;
    }
  }
}

TEST(Relu, BackwardMasksByOutput) {
  const Shape s{2, 3, 4};
  auto layer = MakeLayer("relu", {}, {s.WithoutBatch()});
  Tensor x = AwayFromZero(s, 5);
  Tensor dy = RandomTensor(s, 6);
  Tensor y = RunForward(*layer, {x}, s, {});
  Tensor dx = Tensor::Empty(s, DType::kF64);
  layer->Backward({&x}, y, dy, {&dx});
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(dx.At(i), x.At(i) > 0 ? dy.At(i) : 0.0) << i;
  }
  EXPECT_NO_THROW(layer->Backward({&x}, y, dy, {nullptr}));
}

TEST(Relu, GradientCheck) {
  for (const Shape& s : {Shape{1, 7}, Shape{3, 2, 5}, Shape{2, 3, 5, 7}}) {
    SCOPED_TRACE(s.ToString());
    auto layer = MakeLayer("relu", {}, {s.WithoutBatch()});
    EXPECT_EQ(layer->parameters().size(), 0u);
    CheckGradients(*layer, {AwayFromZero(s, 8)}, s);
  }
}

}  // namespace
}  // namespace cnnflow
