#include "ops/layers/linear.h"

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

Args LinearArgs(int64_t out, bool bias = true, int64_t in = 0) {
  Args a;
  a.Set("out", out);
  a.Set("bias", bias);
  a.Set("in", in);
  return a;
}

// Naive y[n, o] = sum_f x[n, f] * w[o, f] + b[o], in double.
Tensor NaiveLinear(const Tensor& x_in, const Tensor& w_in, const Tensor* b) {
  const Tensor x = x_in.Cast(DType::kF64), w = w_in.Cast(DType::kF64);
  const int64_t n = x.dim(0), f = x.numel() / n, out = w.dim(0);
  const double* xs = x.data<double>();
  const double* ws = w.data<double>();
  Tensor y = Tensor::Empty({n, out}, DType::kF64);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t o = 0; o < out; ++o) {
      double s = b != nullptr ? b->At(o) : 0.0;
      for (int64_t k = 0; k < f; ++k) s += xs[i * f + k] * ws[o * f + k];
      y.data<double>()[i * out + o] = s;
    }
  }
  return y;
}

void ExpectNear(const Tensor& a, const Tensor& b, double tol) {
  ASSERT_EQ(a.numel(), b.numel());
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_NEAR(a.At(i), b.At(i), tol) << "at " << i;
}

TEST(Linear, ForwardMatchesNaiveOnFlattenedInput) {
  for (bool bias : {true, false}) {
    auto layer = MakeLayer("linear", LinearArgs(5, bias), {Shape{2, 3, 4}});
    EXPECT_EQ(layer->parameters().size(), bias ? 2u : 1u);
    EXPECT_EQ(layer->parameters()[0].value.shape(), Shape({5, 24}));
    Tensor x = RandomTensor({3, 2, 3, 4}, 7);
    Tensor y = RunForward(*layer, {x}, {3, 5}, {});
    Tensor ref = NaiveLinear(x, layer->parameters()[0].value,
                             bias ? &layer->parameters()[1].value : nullptr);
    ExpectNear(y, ref, 1e-12);
  }
}

TEST(Linear, ForwardFloatMatchesNaive) {
  auto layer = MakeLayer("linear", LinearArgs(10), {Shape{128}}, DType::kF32);
  Tensor x = RandomTensor({9, 128}, 3, -1, 1, DType::kF32);
  Tensor y = RunForward(*layer, {x}, {9, 10}, {});
  Tensor ref = NaiveLinear(x, layer->parameters()[0].value, &layer->parameters()[1].value);
  ExpectNear(y, ref, 1e-4);
}

TEST(Linear, GradientCheck) {
  struct Case {
    int64_t n;
    Shape in;
    int64_t out;
    bool bias;
  };
  for (const Case& c : {Case{1, {5}, 3, true}, Case{3, {2, 3, 3}, 4, true}, Case{2, {7}, 1, false},
                        Case{4, {1, 5, 1}, 6, true}}) {
    SCOPED_TRACE(c.in.ToString());
    auto layer = MakeLayer("linear", LinearArgs(c.out, c.bias), {c.in});
    CheckGradients(*layer, {RandomTensor(c.in.WithBatch(c.n), 11)}, Shape{c.n, c.out});
  }
}

// Shapes big enough that the GEMMs are split into chunks, along the batch
// rows, the output features or the input features.
TEST(Linear, ChunkedForwardBackwardMatchNaive) {
  struct Case {
    int64_t n, f, out;
  };
  for (const Case& c : {Case{37, 2000, 300}, Case{520, 64, 600}, Case{520, 600, 64}}) {
    SCOPED_TRACE(StrCat(c.n, "x", c.f, "->", c.out));
    const int64_t n = c.n, f = c.f, out = c.out;
    auto layer = MakeLayer("linear", LinearArgs(out), {Shape{f}});
    Tensor x = RandomTensor({n, f}, 5);
    Tensor dy = RandomTensor({n, out}, 6);
    Tensor y = RunForward(*layer, {x}, {n, out}, {});
    ExpectNear(y, NaiveLinear(x, layer->parameters()[0].value, &layer->parameters()[1].value),
               1e-10);

    Tensor dx = Tensor::Empty({n, f}, DType::kF64);
    layer->Backward({&x}, y, dy, {&dx});
    const double* xs = x.data<double>();
    const double* g = dy.data<double>();
    const double* w = layer->parameters()[0].value.data<double>();
    const double* dxs = dx.data<double>();
    const double* dw = layer->parameters()[0].grad.data<double>();
    const double* db = layer->parameters()[1].grad.data<double>();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < f; ++k) {
        double s = 0;
        for (int64_t o = 0; o < out; ++o) s += g[i * out + o] * w[o * f + k];
        ASSERT_NEAR(dxs[i * f + k], s, 1e-10) << "dx " << i << "," << k;
      }
    }
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t k = 0; k < f; ++k) {
        double s = 0;
        for (int64_t i = 0; i < n; ++i) s += g[i * out + o] * xs[i * f + k];
        ASSERT_NEAR(dw[o * f + k], s, 1e-10) << "dw " << o << "," << k;
      }
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += g[i * out + o];
      ASSERT_NEAR(db[o], s, 1e-10) << "db " << o;
    }
  }
}

TEST(Linear, GradientsAccumulateAndDxIsOptional) {
  auto layer = MakeLayer("linear", LinearArgs(3), {Shape{4}});
  Tensor x = RandomTensor({2, 4}, 1);
  Tensor dy = RandomTensor({2, 3}, 2);
  Tensor y = RunForward(*layer, {x}, {2, 3}, {});
  layer->Backward({&x}, y, dy, {nullptr});
  Tensor once_w = layer->parameters()[0].grad.Clone();
  Tensor once_b = layer->parameters()[1].grad.Clone();
  layer->Backward({&x}, y, dy, {nullptr});
  for (int64_t i = 0; i < once_w.numel(); ++i)
    EXPECT_NEAR(layer->parameters()[0].grad.At(i), 2 * once_w.At(i), 1e-12);
  for (int64_t i = 0; i < once_b.numel(); ++i)
    EXPECT_NEAR(layer->parameters()[1].grad.At(i), 2 * once_b.At(i), 1e-12);
}

TEST(Linear, ResultsDoNotDependOnThreadCount) {
  const int64_t n = 64, out = 128;
  auto run = [&](int threads) {
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, threads);
    auto layer = MakeLayer("linear", LinearArgs(out), {Shape{64, 7, 7}}, DType::kF32);
    Tensor x = RandomTensor({n, 64, 7, 7}, 5, -1, 1, DType::kF32);
    Tensor dy = RandomTensor({n, out}, 6, -1, 1, DType::kF32);
    Tensor y = RunForward(*layer, {x}, {n, out}, {});
    Tensor dx = Tensor::Empty(x.shape(), DType::kF32);
    layer->Backward({&x}, y, dy, {&dx});
    return std::vector<Tensor>{y, dx, layer->parameters()[0].grad, layer->parameters()[1].grad};
  };
  auto a = run(1), b = run(2);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].nbytes()), 0) << "tensor " << i;
  }
}

TEST(Linear, InitIsPytorchDefault) {
  auto layer = MakeLayer("linear", LinearArgs(50), {Shape{16}});
  const double bound = 1.0 / std::sqrt(16.0);
  for (auto& p : layer->parameters()) {
    double max_abs = 0;
    for (int64_t i = 0; i < p.value.numel(); ++i)
      max_abs = std::max(max_abs, std::abs(p.value.At(i)));
    EXPECT_LE(max_abs, bound) << p.name;
    EXPECT_GT(max_abs, 0.8 * bound) << p.name;  // really spread over the range
  }
  EXPECT_EQ(layer->ForwardFlops(8), 2 * 8 * 16 * 50);
}

TEST(Linear, WrongInputFeaturesIsShapeError) {
  try {
    MakeLayer("linear", LinearArgs(128, true, 3136), {Shape{64, 6, 6}});
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "expects 3136 input features (in: 3136), got [64, 6, 6] = 2304");
  }
  // A matching `in` is accepted.
  EXPECT_NO_THROW(MakeLayer("linear", LinearArgs(10, true, 2304), {Shape{64, 6, 6}}));
}

TEST(Linear, SchemaRequiresOut) {
  const LayerType* t = LayerRegistry::Get().Find("linear");
  ASSERT_NE(t, nullptr);
  ASSERT_NE(t->schema.Find("out"), nullptr);
  EXPECT_FALSE(t->schema.Find("out")->default_value.has_value());
  EXPECT_THROW(MakeLayer("linear", LinearArgs(0), {Shape{4}}), ConfigError);
}

}  // namespace
}  // namespace cnnflow
