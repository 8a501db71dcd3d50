#include "ops/layers/dropout.h"

#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <cstring>

#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

using testing::CheckGradients;
using testing::MakeLayer;
using testing::RandomTensor;
using testing::RunForward;

Args DropoutArgs(double p) {
  Args a;
  a.Set("p", p);
  return a;
}

ForwardContext Training(uint64_t seed = 42, int64_t step = 3) {
  ForwardContext ctx;
  ctx.training = true;
  ctx.seed = seed;
  ctx.step = step;
  return ctx;
}

TEST(Dropout, EvalIsIdentity) {
  const Shape s{4, 3, 5};
  auto layer = MakeLayer("dropout", DropoutArgs(0.5), {s.WithoutBatch()}, DType::kF32);
  Tensor x = RandomTensor(s, 1, -1, 1, DType::kF32);
  ForwardContext eval;
  eval.training = false;
  Tensor y = RunForward(*layer, {x}, s, eval);
  EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0);
  Tensor dy = RandomTensor(s, 2, -1, 1, DType::kF32);
  Tensor dx = Tensor::Empty(s, DType::kF32);
  layer->Backward({&x}, y, dy, {&dx});
  EXPECT_EQ(std::memcmp(dx.raw_data(), dy.raw_data(), dy.nbytes()), 0);
}

TEST(Dropout, TrainingZeroesOrScalesAndKeepsAboutOneMinusP) {
  for (double p : {0.2, 0.5, 0.8}) {
    SCOPED_TRACE(p);
    const Shape s{16, 100, 100};  // 160000 draws: the kept fraction's sd is ~0.001
    auto layer = MakeLayer("dropout", DropoutArgs(p), {s.WithoutBatch()}, DType::kF32);
    Tensor x = RandomTensor(s, 1, 0.5, 1.5, DType::kF32);  // never 0
    Tensor y = RunForward(*layer, {x}, s, Training());
    const float scale = static_cast<float>(1.0 / (1.0 - p));
    int64_t kept = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double v = y.At(i);
      if (v != 0) {
        ++kept;
        ASSERT_EQ(v, static_cast<float>(x.At(i)) * scale) << i;
      }
    }
    EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(x.numel()), 1 - p, 0.01);
  }
}

TEST(Dropout, BackwardUsesTheForwardMask) {
  const Shape s{3, 50};
  auto layer = MakeLayer("dropout", DropoutArgs(0.4), {s.WithoutBatch()});
  Tensor x = RandomTensor(s, 1, 0.5, 1.5);
  Tensor y = RunForward(*layer, {x}, s, Training());
  Tensor dy = RandomTensor(s, 2);
  Tensor dx = Tensor::Empty(s, DType::kF64);
  layer->Backward({&x}, y, dy, {&dx});
  int zeros = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (y.At(i) == 0) {
      ++zeros;
      ASSERT_EQ(dx.At(i), 0.0);
    } else {
      ASSERT_DOUBLE_EQ(dx.At(i), dy.At(i) / 0.6);
    }
  }
  EXPECT_GT(zeros, 0);
}

TEST(Dropout, MaskDependsOnSeedStepAndNameOnly) {
  const Shape s{8, 200};
  auto mask = [&](const std::string& name, const ForwardContext& ctx) {
    const LayerType* t = LayerRegistry::Get().Find("dropout");
    Args a = DropoutArgs(0.5);
    a.FillDefaults(t->schema);
    auto layer = t->create(name, a);
    layer->Build({s.WithoutBatch()}, DType::kF64);
    RunForward(*layer, {Tensor::Full(s, 1.0, DType::kF64)}, s, ctx);
    return static_cast<DropoutLayer&>(*layer).mask().Clone();
  };
  auto same = [](const Tensor& a, const Tensor& b) {
    return std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
  };
  const Tensor base = mask("drop1", Training(1, 5));
  EXPECT_TRUE(same(base, mask("drop1", Training(1, 5))));
  EXPECT_FALSE(same(base, mask("drop1", Training(2, 5))));
  EXPECT_FALSE(same(base, mask("drop1", Training(1, 6))));
  EXPECT_FALSE(same(base, mask("drop2", Training(1, 5))));
}

TEST(Dropout, MaskIsTheDocumentedDraw) {
  // Element i is kept iff UniformAt(StreamKey(seed, step, hash(name)), i) >= p.
  const Shape s{5, 333};
  const double p = 0.37;
  auto layer = MakeLayer("dropout", DropoutArgs(p), {s.WithoutBatch()});
  const ForwardContext ctx = Training(123, 45);
  RunForward(*layer, {Tensor::Full(s, 1.0, DType::kF64)}, s, ctx);
  const Tensor& mask = static_cast<DropoutLayer&>(*layer).mask();
  const uint64_t key = DropoutLayer::MaskKey(ctx, layer->name());
  for (int64_t i = 0; i < mask.numel(); ++i) {
    const bool keep = UniformAt(key, static_cast<uint64_t>(i)) >= p;
    ASSERT_EQ(mask.At(i), keep ? 1.0 / (1.0 - p) : 0.0) << i;
  }
  EXPECT_NE(DropoutLayer::MaskKey(ctx, "a"), DropoutLayer::MaskKey(ctx, "b"));
}

TEST(Dropout, SampleIdsKeyTheMaskSoAShardSeesTheSameMaskAsTheWholeBatch) {
  // A batch of samples {11, 4, 7} and a shard holding only {7}: row 2 of
  // the batch and row 0 of the shard get the same mask; the documented draw.
  const Shape per{3, 5};
  const double p = 0.5;
  const std::vector<int64_t> ids = {11, 4, 7};
  ForwardContext ctx = Training(9, 3);
  auto whole = MakeLayer("dropout", DropoutArgs(p), {per});
  ctx.sample_ids = ids.data();
  RunForward(*whole, {Tensor::Full(per.WithBatch(3), 1.0, DType::kF64)}, per.WithBatch(3), ctx);
  auto shard = MakeLayer("dropout", DropoutArgs(p), {per});
  ctx.sample_ids = ids.data() + 2;
  RunForward(*shard, {Tensor::Full(per.WithBatch(1), 1.0, DType::kF64)}, per.WithBatch(1), ctx);
  const Tensor& a = static_cast<DropoutLayer&>(*whole).mask();
  const Tensor& b = static_cast<DropoutLayer&>(*shard).mask();
  const uint64_t key = DropoutLayer::MaskKey(ctx, shard->name());
  int kept = 0;
  for (int64_t j = 0; j < per.numel(); ++j) {
    ASSERT_EQ(a.At(2 * per.numel() + j), b.At(j)) << j;
    const bool keep = UniformAt(key, static_cast<uint64_t>(7 * per.numel() + j)) >= p;
    ASSERT_EQ(b.At(j), keep ? 2.0 : 0.0) << j;
    kept += keep;
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, per.numel());
}

TEST(Dropout, MaskIndependentOfThreadCount) {
  const Shape s{32, 64, 14, 14};  // 401408 elements: many parallel tasks
  auto run = [&](int threads) {
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, threads);
    auto layer = MakeLayer("dropout", DropoutArgs(0.3), {s.WithoutBatch()}, DType::kF32);
    Tensor x = RandomTensor(s, 1, -1, 1, DType::kF32);
    Tensor y = RunForward(*layer, {x}, s, Training(7, 11));
    Tensor dy = RandomTensor(s, 2, -1, 1, DType::kF32);
    Tensor dx = Tensor::Empty(s, DType::kF32);
    layer->Backward({&x}, y, dy, {&dx});
    return std::make_pair(y, dx);
  };
  auto [y1, dx1] = run(1);
  auto [y2, dx2] = run(2);
  EXPECT_EQ(std::memcmp(y1.raw_data(), y2.raw_data(), y1.nbytes()), 0);
  EXPECT_EQ(std::memcmp(dx1.raw_data(), dx2.raw_data(), dx1.nbytes()), 0);
}

TEST(Dropout, GradientCheck) {
  for (const Shape& s : {Shape{1, 9}, Shape{3, 2, 5}, Shape{2, 3, 3, 5}}) {
    SCOPED_TRACE(s.ToString());
    auto layer = MakeLayer("dropout", DropoutArgs(0.5), {s.WithoutBatch()});
    testing::GradCheckOptions opt;
    opt.ctx = Training(5, 9);  // the same mask in every evaluation
    CheckGradients(*layer, {RandomTensor(s, 3)}, s, opt);
  }
}

TEST(Dropout, ExtremeProbabilities) {
  const Shape s{4, 10};
  Tensor x = RandomTensor(s, 1, 0.5, 1.5);
  auto keep_all = MakeLayer("dropout", DropoutArgs(0.0), {s.WithoutBatch()});
  Tensor y0 = RunForward(*keep_all, {x}, s, Training());
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(y0.At(i), x.At(i));
  auto drop_all = MakeLayer("dropout", DropoutArgs(1.0), {s.WithoutBatch()});
  Tensor y1 = RunForward(*drop_all, {x}, s, Training());
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(y1.At(i), 0.0);
  EXPECT_THROW(MakeLayer("dropout", DropoutArgs(1.5), {s.WithoutBatch()}), ConfigError);
  EXPECT_THROW(MakeLayer("dropout", DropoutArgs(-0.1), {s.WithoutBatch()}), ConfigError);
}

}  // namespace
}  // namespace cnnflow
