// drop_path (stochastic depth, torchvision's mode "row"): whole samples
// zeroed or scaled by 1/(1-p), drawn from dropout's keyed stream by sample
// id (the same decision whatever the batch position), the rate ~p, the
// identity in evaluation and at p = 0. The layer table
// (tests/ops/layers/layer_table.cc) checks the gradients.
#include "ops/layers/drop_path.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "ops/layers/dropout.h"
#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

using testing::MakeLayer;
using testing::RandomTensor;
using testing::RunForward;

Args P(double p) {
  Args a;
  a.Set("p", p);
  return a;
}

ForwardContext Training(const int64_t* ids = nullptr) {
  ForwardContext ctx;
  ctx.training = true;
  ctx.seed = 17;
  ctx.step = 9;
  ctx.sample_ids = ids;
  return ctx;
}

TEST(DropPath, IdentityInEvaluationAndAtPZero) {
  const Shape s{4, 3, 5};
  Tensor x = RandomTensor(s, 1, -1, 1, DType::kF32);
  ForwardContext eval;
  eval.training = false;
  for (auto [p, ctx] : {std::pair{0.5, eval}, std::pair{0.0, Training()}}) {
    auto layer = MakeLayer("drop_path", P(p), {s.WithoutBatch()}, DType::kF32);
    Tensor y = RunForward(*layer, {x}, s, ctx);
    EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0);
    Tensor dx = Tensor::Empty(s, DType::kF32);
    layer->Backward({&x}, y, x, {&dx});
    EXPECT_EQ(std::memcmp(x.raw_data(), dx.raw_data(), x.nbytes()), 0);
  }
}

TEST(DropPath, WholeSamplesAtRateP) {
  for (double p : {0.1, 0.5, 0.9}) {
    SCOPED_TRACE(p);
    const Shape s{20000, 2, 3};  // the dropped fraction's sd is <= 0.0036
    auto layer = MakeLayer("drop_path", P(p), {s.WithoutBatch()}, DType::kF32);
    Tensor x = RandomTensor(s, 1, 0.5, 1.5, DType::kF32);  // never 0
    Tensor y = RunForward(*layer, {x}, s, Training());
    const float scale = static_cast<float>(1.0 / (1.0 - p));
    int64_t dropped = 0;
    for (int64_t n = 0; n < s[0]; ++n) {
      const bool drop = y.At(n * 6) == 0;
      dropped += drop;
      for (int64_t j = 0; j < 6; ++j) {
        ASSERT_EQ(y.At(n * 6 + j), drop ? 0.0f : static_cast<float>(x.At(n * 6 + j)) * scale);
      }
    }
    EXPECT_NEAR(static_cast<double>(dropped) / s[0], p, 0.015);
  }
}

TEST(DropPath, DecisionIsKeyedBySampleId) {
  // The documented draw, and the same decision for a sample at any batch
  // position (a replica or micro-batch sees other neighbours).
  const double p = 0.5;
  const Shape s{64, 5};
  std::vector<int64_t> ids(64);
  std::iota(ids.begin(), ids.end(), 1000);
  std::vector<int64_t> reversed(ids.rbegin(), ids.rend());
  auto layer = MakeLayer("drop_path", P(p), {s.WithoutBatch()});
  Tensor x = Tensor::Full(s, 1.0, DType::kF64);
  const ForwardContext ctx = Training(ids.data());
  Tensor y = RunForward(*layer, {x}, s, ctx);
  const uint64_t key = DropoutLayer::MaskKey(ctx, layer->name());
  int kept = 0;
  for (int64_t n = 0; n < 64; ++n) {
    const bool keep = UniformAt(key, static_cast<uint64_t>(ids[n])) >= p;
    kept += keep;
    ASSERT_EQ(y.At(n * 5), keep ? 2.0 : 0.0) << n;
  }
  EXPECT_GT(kept, 10);
  EXPECT_LT(kept, 54);
  Tensor y_rev = RunForward(*layer, {x}, s, Training(reversed.data()));
  for (int64_t n = 0; n < 64; ++n) ASSERT_EQ(y_rev.At(n * 5), y.At((63 - n) * 5)) << n;
  // A half batch (a micro-batch) of the same ids: the same decisions.
  const Shape half{32, 5};
  Tensor y_half =
      RunForward(*layer, {Tensor::Full(half, 1.0, DType::kF64)}, half, Training(ids.data() + 32));
  for (int64_t n = 0; n < 32; ++n) ASSERT_EQ(y_half.At(n * 5), y.At((32 + n) * 5)) << n;
}

TEST(DropPath, BackwardUsesTheForwardDecisions) {
  const Shape s{40, 7};
  auto layer = MakeLayer("drop_path", P(0.3), {s.WithoutBatch()});
  Tensor x = RandomTensor(s, 1, 0.5, 1.5);
  Tensor y = RunForward(*layer, {x}, s, Training());
  Tensor dy = RandomTensor(s, 2);
  Tensor dx = Tensor::Empty(s, DType::kF64);
  layer->Backward({&x}, y, dy, {&dx});
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_DOUBLE_EQ(dx.At(i), y.At(i) == 0 ? 0.0 : dy.At(i) / 0.7) << i;
  }
}

TEST(DropPath, PEqualOneGivesZeros) {
  const Shape s{5, 3};
  auto layer = MakeLayer("drop_path", P(1.0), {s.WithoutBatch()});
  Tensor y = RunForward(*layer, {RandomTensor(s, 1)}, s, Training());
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.At(i), 0.0);
  EXPECT_THROW(MakeLayer("drop_path", P(1.5), {s.WithoutBatch()}), ConfigError);
}

}  // namespace
}  // namespace cnnflow
