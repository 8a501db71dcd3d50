#include "ops/layers/flatten.h"

#include <gtest/gtest.h>

#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

using testing::CheckGradients;
using testing::MakeLayer;
using testing::RandomTensor;
using testing::RunForward;

TEST(Flatten, OutputShape) {
  std::vector<Shape> out;
  for (const Shape& s : {Shape{64, 7, 7}, Shape{3, 11}, Shape{5}}) {
    auto layer = MakeLayer("flatten", {}, {s});
    EXPECT_EQ(layer->Build({s}, DType::kF32), Shape({s.numel()}));
  }
}

TEST(Flatten, ForwardMatchesNaiveIndexing) {
  const int64_t n = 2, c = 3, h = 4, w = 5;
  auto layer = MakeLayer("flatten", {}, {Shape{c, h, w}}, DType::kF32);
  Tensor x = RandomTensor({n, c, h, w}, 3, -1, 1, DType::kF32);
  Tensor y = RunForward(*layer, {x}, {n, c * h * w}, {});
  EXPECT_EQ(y.shape(), Shape({n, c * h * w}));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t cc = 0; cc < c; ++cc)
      for (int64_t hh = 0; hh < h; ++hh)
        for (int64_t ww = 0; ww < w; ++ww) {
          const int64_t src = ((i * c + cc) * h + hh) * w + ww;
          const int64_t dst = i * c * h * w + (cc * h + hh) * w + ww;
          ASSERT_EQ(y.At(dst), x.At(src));
        }
  // The output does not alias the input.
  EXPECT_NE(y.raw_data(), x.raw_data());
}

TEST(Flatten, GradientCheck) {
  for (const Shape& s : {Shape{1, 2, 3, 3}, Shape{3, 5, 7}, Shape{2, 1}}) {
    SCOPED_TRACE(s.ToString());
    auto layer = MakeLayer("flatten", {}, {s.WithoutBatch()});
    CheckGradients(*layer, {RandomTensor(s, 9)}, Shape{s[0], s.numel() / s[0]});
  }
}

TEST(Flatten, BackwardRestoresShape) {
  auto layer = MakeLayer("flatten", {}, {Shape{2, 3}});
  Tensor x = RandomTensor({4, 2, 3}, 1);
  Tensor dy = RandomTensor({4, 6}, 2);
  Tensor y = RunForward(*layer, {x}, {4, 6}, {});
  Tensor dx = Tensor::Empty({4, 2, 3}, DType::kF64);
  layer->Backward({&x}, y, dy, {&dx});
  for (int64_t i = 0; i < dy.numel(); ++i) ASSERT_EQ(dx.At(i), dy.At(i));
}

}  // namespace
}  // namespace cnnflow
