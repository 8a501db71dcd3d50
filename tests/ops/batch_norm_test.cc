#include "ops/batch_norm.h"

#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <cmath>
#include <cstring>

#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

using testing::CheckGradients;
using testing::MakeLayer;
using testing::RandomTensor;
using testing::RunForward;

Args BnArgs(double momentum = 0.1, double eps = 1e-5, bool affine = true) {
  Args a;
  a.Set("momentum", momentum);
  a.Set("eps", eps);
  a.Set("affine", affine);
  return a;
}

ForwardContext Mode(bool training) {
  ForwardContext ctx;
  ctx.training = training;
  return ctx;
}

// Gives weight, bias and the running statistics non-trivial values.
void Randomise(Layer& layer, uint64_t seed) {
  Rng rng(seed);
  for (auto& p : layer.parameters())
    for (int64_t i = 0; i < p.value.numel(); ++i)
      p.value.Set(i, p.name == "weight" ? rng.Uniform(0.5, 1.5) : rng.Uniform(-0.5, 0.5));
  Tensor& rm = layer.buffers()[0].value;
  Tensor& rv = layer.buffers()[1].value;
  for (int64_t i = 0; i < rm.numel(); ++i) {
    rm.Set(i, rng.Uniform(-0.3, 0.3));
    rv.Set(i, rng.Uniform(0.5, 2.0));
  }
}

// Naive reference: x viewed as [N, C, S]; statistics per channel.
struct NaiveBn {
  std::vector<double> mean, var;
  Tensor y;
};
NaiveBn NaiveBatchNorm(const Tensor& x, Layer& layer, bool training, double eps) {
  const int64_t n = x.dim(0), c_n = x.dim(1), s_n = x.numel() / (n * c_n);
  NaiveBn r;
  r.mean.assign(c_n, 0);
  r.var.assign(c_n, 0);
  r.y = Tensor::Empty(x.shape(), DType::kF64);
  const bool affine = !layer.parameters().empty();
  for (int64_t c = 0; c < c_n; ++c) {
    double mean = 0, var = 0;
    if (training) {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t s = 0; s < s_n; ++s) mean += x.At((i * c_n + c) * s_n + s);
      mean /= static_cast<double>(n * s_n);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t s = 0; s < s_n; ++s) {
          const double d = x.At((i * c_n + c) * s_n + s) - mean;
          var += d * d;
        }
      var /= static_cast<double>(n * s_n);
    } else {
      mean = layer.buffers()[0].value.At(c);
      var = layer.buffers()[1].value.At(c);
    }
    r.mean[c] = mean;
    r.var[c] = var;
    const double g = affine ? layer.parameters()[0].value.At(c) : 1.0;
    const double b = affine ? layer.parameters()[1].value.At(c) : 0.0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t s = 0; s < s_n; ++s) {
        const int64_t k = (i * c_n + c) * s_n + s;
        r.y.Set(k, (x.At(k) - mean) / std::sqrt(var + eps) * g + b);
      }
  }
  return r;
}

TEST(BatchNorm, ParametersAndBuffersAsPytorch) {
  auto layer = MakeLayer("batchnorm", BnArgs(), {Shape{3, 4, 4}});
  ASSERT_EQ(layer->parameters().size(), 2u);
  EXPECT_EQ(layer->parameters()[0].name, "weight");
  EXPECT_EQ(layer->parameters()[1].name, "bias");
  ASSERT_EQ(layer->buffers().size(), 2u);
  EXPECT_EQ(layer->buffers()[0].name, "running_mean");
  EXPECT_EQ(layer->buffers()[1].name, "running_var");
  for (int64_t c = 0; c < 3; ++c) {
    EXPECT_EQ(layer->parameters()[0].value.At(c), 1.0);
    EXPECT_EQ(layer->parameters()[1].value.At(c), 0.0);
    EXPECT_EQ(layer->buffers()[0].value.At(c), 0.0);
    EXPECT_EQ(layer->buffers()[1].value.At(c), 1.0);
  }
  auto plain = MakeLayer("batchnorm", BnArgs(0.1, 1e-5, false), {Shape{3}});
  EXPECT_TRUE(plain->parameters().empty());
  EXPECT_EQ(plain->buffers().size(), 2u);
  EXPECT_THROW(MakeLayer("batchnorm", BnArgs(), {Shape{2, 3, 4, 5}}), ShapeError);
}

TEST(BatchNorm, ForwardMatchesNaive) {
  for (const Shape& s : {Shape{4, 3, 5, 6}, Shape{3, 4, 7}, Shape{6, 5}, Shape{1, 2, 3, 3}}) {
    for (bool training : {true, false}) {
      SCOPED_TRACE(s.ToString() + (training ? " training" : " eval"));
      auto layer = MakeLayer("batchnorm", BnArgs(), {s.WithoutBatch()});
      Randomise(*layer, 3);
      Tensor x = RandomTensor(s, 4, -2, 3);
      NaiveBn ref = NaiveBatchNorm(x, *layer, training, 1e-5);  // before the running update
      Tensor y = RunForward(*layer, {x}, s, Mode(training));
      for (int64_t i = 0; i < y.numel(); ++i) ASSERT_NEAR(y.At(i), ref.y.At(i), 1e-12) << i;
    }
  }
}

TEST(BatchNorm, ForwardFloatMatchesNaive) {
  // A large mean next to a small spread: the f32 kernel must not cancel.
  const Shape s{8, 4, 9, 9};
  auto layer = MakeLayer("batchnorm", BnArgs(), {s.WithoutBatch()}, DType::kF32);
  Tensor x = RandomTensor(s, 5, 99, 101, DType::kF32);
  NaiveBn ref = NaiveBatchNorm(x, *layer, true, 1e-5);
  Tensor y = RunForward(*layer, {x}, s, Mode(true));
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_NEAR(y.At(i), ref.y.At(i), 2e-4) << i;
}

TEST(BatchNorm, RunningStatsUpdateByHand) {
  // One channel, values {1, 2, 3, 6}: mean 3, biased var 3.5, unbiased var 14/3.
  auto layer = MakeLayer("batchnorm", BnArgs(0.1), {Shape{1, 2}});
  Tensor x = Tensor::Empty({2, 1, 2}, DType::kF64);
  const double v[] = {1, 2, 3, 6};
  for (int i = 0; i < 4; ++i) x.Set(i, v[i]);
  Tensor y = RunForward(*layer, {x}, {2, 1, 2}, Mode(true));
  EXPECT_NEAR(layer->buffers()[0].value.At(0), 0.9 * 0 + 0.1 * 3, 1e-12);
  EXPECT_NEAR(layer->buffers()[1].value.At(0), 0.9 * 1 + 0.1 * 14.0 / 3.0, 1e-12);
  // Normalised with the biased variance.
  EXPECT_NEAR(y.At(0), (1 - 3) / std::sqrt(3.5 + 1e-5), 1e-12);
  // A second step compounds: running = 0.9 * running + 0.1 * batch.
  RunForward(*layer, {x}, {2, 1, 2}, Mode(true));
  EXPECT_NEAR(layer->buffers()[0].value.At(0), 0.9 * 0.3 + 0.1 * 3, 1e-12);
  EXPECT_NEAR(layer->buffers()[1].value.At(0), 0.9 * (0.9 + 0.1 * 14.0 / 3.0) + 0.1 * 14.0 / 3.0,
              1e-12);
  // Eval neither uses nor changes the batch statistics.
  const double rm = layer->buffers()[0].value.At(0), rv = layer->buffers()[1].value.At(0);
  Tensor ye = RunForward(*layer, {x}, {2, 1, 2}, Mode(false));
  EXPECT_EQ(layer->buffers()[0].value.At(0), rm);
  EXPECT_NEAR(ye.At(3), (6 - rm) / std::sqrt(rv + 1e-5), 1e-12);

  // Another momentum: running = (1 - m) * running + m * batch.
  auto fast = MakeLayer("batchnorm", BnArgs(0.5), {Shape{1, 2}});
  RunForward(*fast, {x}, {2, 1, 2}, Mode(true));
  EXPECT_NEAR(fast->buffers()[0].value.At(0), 1.5, 1e-12);
  EXPECT_NEAR(fast->buffers()[1].value.At(0), 0.5 + 0.5 * 14.0 / 3.0, 1e-12);
}

TEST(BatchNorm, GradientCheckTraining) {
  for (const Shape& s : {Shape{2, 3, 4, 5}, Shape{1, 2, 3, 3}, Shape{3, 4, 5}, Shape{5, 3}}) {
    for (bool affine : {true, false}) {
      SCOPED_TRACE(s.ToString() + (affine ? " affine" : ""));
      auto layer = MakeLayer("batchnorm", BnArgs(0.1, 1e-5, affine), {s.WithoutBatch()});
      Randomise(*layer, 7);
      testing::GradCheckOptions opt;
      opt.ctx = Mode(true);
      CheckGradients(*layer, {RandomTensor(s, 8)}, s, opt);
    }
  }
}

TEST(BatchNorm, GradientCheckEval) {
  for (const Shape& s : {Shape{2, 3, 4, 5}, Shape{1, 2, 3, 3}, Shape{3, 4, 5}, Shape{1, 3}}) {
    SCOPED_TRACE(s.ToString());
    auto layer = MakeLayer("batchnorm", BnArgs(), {s.WithoutBatch()});
    Randomise(*layer, 9);
    testing::GradCheckOptions opt;
    opt.ctx = Mode(false);
    CheckGradients(*layer, {RandomTensor(s, 10)}, s, opt);
  }
}

TEST(BatchNorm, ResultsDoNotDependOnThreadCount) {
  const Shape s{64, 32, 14, 14};
  auto run = [&](int threads) {
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, threads);
    auto layer = MakeLayer("batchnorm", BnArgs(), {s.WithoutBatch()}, DType::kF32);
    Tensor x = RandomTensor(s, 1, -1, 2, DType::kF32);
    Tensor y = RunForward(*layer, {x}, s, Mode(true));
    Tensor dy = RandomTensor(s, 2, -1, 1, DType::kF32);
    Tensor dx = Tensor::Empty(s, DType::kF32);
    layer->Backward({&x}, y, dy, {&dx});
    return std::vector<Tensor>{y,
                               dx,
                               layer->parameters()[0].grad,
                               layer->parameters()[1].grad,
                               layer->buffers()[0].value,
                               layer->buffers()[1].value};
  };
  auto a = run(1), b = run(2);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].nbytes()), 0) << "tensor " << i;
}

TEST(BatchNorm, SingleValuePerChannelInTrainingIsError) {
  auto layer = MakeLayer("batchnorm", BnArgs(), {Shape{4}});
  Tensor x = RandomTensor({1, 4}, 1);
  try {
    RunForward(*layer, {x}, {1, 4}, Mode(true));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than 1 value per channel"), std::string::npos);
  }
  EXPECT_NO_THROW(RunForward(*layer, {x}, {1, 4}, Mode(false)));
}

}  // namespace
}  // namespace cnnflow
