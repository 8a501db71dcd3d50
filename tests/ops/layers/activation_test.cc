// The activation layers (ops/layers/activation.h), what the layer table
// (tests/ops/layers/layer_table.cc: gradient check, f32 vs f64, GPU vs CPU) does
// not check: every type against an independent reference (the defining
// formula in long double, its derivative by central differences) in f32
// (oneDNN or loops) and f64, PyTorch's gradients at the kinks, the same
// result for any thread count, and config errors.
#include "ops/layers/activation.h"

#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/cpu/elementwise.h"
#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

using testing::MakeLayer;
using testing::RandomTensor;
using testing::RunForward;

struct Case {
  const char* type;
  Args args;
  Activation kind;
};

Args With(const char* key, ParamValue v) {
  Args a;
  a.Set(key, std::move(v));
  return a;
}

std::vector<Case> Cases() {
  return {
      {"gelu", {}, Activation::kGeluErf},
      {"gelu", With("approximate", std::string("tanh")), Activation::kGeluTanh},
      {"silu", {}, Activation::kSilu},
      {"sigmoid", {}, Activation::kSigmoid},
      {"tanh", {}, Activation::kTanh},
      {"hardsigmoid", {}, Activation::kHardsigmoid},
      {"hardswish", {}, Activation::kHardswish},
      {"relu6", {}, Activation::kRelu6},
      {"leaky_relu", {}, Activation::kLeakyRelu},
      {"leaky_relu", With("negative_slope", 0.2), Activation::kLeakyRelu},
  };
}

std::string Name(const Case& c) {
  std::string s = c.type;
  for (const auto& [k, v] : c.args.values()) s += " " + k + "=" + ParamValueToString(v);
  return s;
}

// The defining formulas, written here independently of the layer's.
long double Reference(Activation k, long double x, long double a) {
  const long double sigmoid = 1 / (1 + std::exp(-x));
  switch (k) {
    case Activation::kGeluErf:
      return x / 2 * (1 + std::erf(x / std::sqrt(2.0L)));
    case Activation::kGeluTanh: {
      const long double c = std::sqrt(2 / 3.14159265358979323846264338327950288L);
      return x / 2 * (1 + std::tanh(c * (x + 0.044715L * x * x * x)));
    }
    case Activation::kSilu:
      return x * sigmoid;
    case Activation::kSigmoid:
      return sigmoid;
    case Activation::kTanh:
      return std::tanh(x);
    case Activation::kHardsigmoid:
      return std::min(std::max(x + 3, 0.0L), 6.0L) / 6;
    case Activation::kHardswish:
      return x * std::min(std::max(x + 3, 0.0L), 6.0L) / 6;
    case Activation::kRelu6:
      return std::min(std::max(x, 0.0L), 6.0L);
    case Activation::kLeakyRelu:
      return x > 0 ? x : a * x;
  }
  return 0;
}

// d/dx of the reference by central differences (x away from kinks).
long double ReferenceGrad(Activation k, long double x, long double a) {
  const long double h = 1e-6L;
  return (Reference(k, x + h, a) - Reference(k, x - h, a)) / (2 * h);
}

// Uniform in [lo, hi), moved at least `gap` away from every kink (-3, 0, 3, 6).
Tensor AwayFromKinks(const Shape& s, uint64_t seed, double lo, double hi, double gap, DType dt) {
  Tensor t = RandomTensor(s, seed, lo, hi, dt);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = t.At(i);
    for (double kink : {-3.0, 0.0, 3.0, 6.0}) {
      if (std::abs(v - kink) < gap) v = v < kink ? kink - gap : kink + gap;
    }
    t.Set(i, v);
  }
  return t;
}

TEST(Activation, TypesAndOptions) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(Name(c));
    auto layer = MakeLayer(c.type, c.args, {Shape{4}});
    auto& act = dynamic_cast<ActivationLayer&>(*layer);
    EXPECT_STREQ(layer->type(), c.type);
    EXPECT_EQ(act.kind(), c.kind);
    EXPECT_TRUE(layer->parameters().empty());
  }
  auto leaky = MakeLayer("leaky_relu", {}, {Shape{4}});
  EXPECT_EQ(dynamic_cast<ActivationLayer&>(*leaky).alpha(), 0.01);
}

TEST(Activation, BadOptionsThrowConfigError) {
  EXPECT_THROW(MakeLayer("gelu", With("approximate", std::string("sigmoid")), {Shape{4}}),
               ConfigError);
  EXPECT_THROW(MakeLayer("leaky_relu", With("negative_slope", NAN), {Shape{4}}), ConfigError);
}

// f64: the reference path, to ~1e-9 relative (the grad is a difference quotient).
// f32: oneDNN (gelu, silu, sigmoid, tanh) or the loops, to ~1e-6 relative.
TEST(Activation, MatchesReference) {
  // 3 * 5 * 67 * 67 = 67335 values: two full chunks of 2^15 and a tail.
  const Shape s{3, 5, 67, 67};
  for (DType dt : {DType::kF32, DType::kF64}) {
    const bool f32 = dt == DType::kF32;
    for (const Case& c : Cases()) {
      SCOPED_TRACE(Name(c) + (f32 ? " f32" : " f64"));
      auto layer = MakeLayer(c.type, c.args, {s.WithoutBatch()}, dt);
      const long double a = dynamic_cast<ActivationLayer&>(*layer).alpha();
      Tensor x = AwayFromKinks(s, 11, -9, 9, 1e-3, dt);
      Tensor dy = RandomTensor(s, 12, -1, 1, dt);
      Tensor y = RunForward(*layer, {x}, s, {});
      Tensor dx = Tensor::Empty(s, dt);
      layer->Backward({&x}, y, dy, {&dx});
      // Relative to max(|value|, 1): below 1 it is the absolute error. Where
      // the value is far below 1 (gelu's negative tail, 1 + erf cancelling;
      // 1 - tanh^2 near saturation) no f32 formula is relatively exact:
      // measured, oneDNN's gelu is within 2.6e-7 absolute there (a float
      // std::erf loop 1.1e-7, PyTorch 2.15 the same 2.6e-7), the tanh form's
      // gradient 7.0e-7 (the float std::tanh formula 5.6e-7).
      const double rtol = f32 ? 1e-6 : 1e-9;
      double worst_y = 0, worst_dx = 0;
      for (int64_t i = 0; i < x.numel(); ++i) {
        const long double xi = x.At(i);
        const double ry = static_cast<double>(Reference(c.kind, xi, a));
        const double rdx = static_cast<double>(ReferenceGrad(c.kind, xi, a) * dy.At(i));
        worst_y = std::max(worst_y, std::abs(y.At(i) - ry) / std::max(std::abs(ry), 1.0));
        worst_dx = std::max(worst_dx, std::abs(dx.At(i) - rdx) / std::max(std::abs(rdx), 1.0));
      }
      EXPECT_LE(worst_y, rtol);
      EXPECT_LE(worst_dx, rtol);
      RecordProperty(Name(c) + (f32 ? " f32" : " f64"), StrCat("y ", worst_y, " dx ", worst_dx));
    }
  }
}

// PyTorch's (2.15, measured) gradient at the kinks: hardswish 0 at -3 and 1
// at 3 (x/3 + 1/2 strictly between); hardsigmoid and relu6 0 at theirs;
// leaky_relu the slope at 0.
TEST(Activation, GradientsAtKinksArePyTorchs) {
  struct Point {
    const char* type;
    double x, grad;
  };
  const Point points[] = {
      {"hardswish", -3.0001, 0.0},
      {"hardswish", -3, 0},
      {"hardswish", 3, 1},
      {"hardswish", 2.5, 4.0 / 3},
      {"hardswish", 0, 0.5},
      {"hardsigmoid", -3, 0},
      {"hardsigmoid", 3, 0},
      {"hardsigmoid", 0, 1.0 / 6},
      {"relu6", 0, 0},
      {"relu6", 6, 0},
      {"relu6", 3, 1},
      {"leaky_relu", 0, 0.01},
      {"leaky_relu", 1e-30, 1},
  };
  for (DType dt : {DType::kF32, DType::kF64}) {
    for (const Point& p : points) {
      SCOPED_TRACE(StrCat(p.type, " at ", p.x, " ", DTypeName(dt)));
      auto layer = MakeLayer(p.type, {}, {Shape{1}}, dt);
      Tensor x = Tensor::Full(Shape{1, 1}, p.x, dt);
      Tensor dy = Tensor::Full(Shape{1, 1}, 1.0, dt);
      Tensor y = RunForward(*layer, {x}, Shape{1, 1}, {});
      Tensor dx = Tensor::Empty(Shape{1, 1}, dt);
      layer->Backward({&x}, y, dy, {&dx});
      const double tol = dt == DType::kF32 ? 1e-6 : 1e-12;
      EXPECT_NEAR(dx.At(0), p.grad, tol);
    }
  }
}

// Chunks of a fixed length: bitwise the same output for 1 and 2 threads.
TEST(Activation, SameForAnyThreadCount) {
  const Shape s{4, 3, 101, 101};
  for (const Case& c : Cases()) {
    SCOPED_TRACE(Name(c));
    auto layer = MakeLayer(c.type, c.args, {s.WithoutBatch()}, DType::kF32);
    Tensor x = RandomTensor(s, 3, -6, 6, DType::kF32);
    Tensor dy = RandomTensor(s, 4, -1, 1, DType::kF32);
    std::vector<Tensor> outs;
    for (int threads : {1, 2}) {
      tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
      Tensor y = RunForward(*layer, {x}, s, {});
      Tensor dx = Tensor::Empty(s, DType::kF32);
      layer->Backward({&x}, y, dy, {&dx});
      outs.push_back(y);
      outs.push_back(dx);
    }
    EXPECT_EQ(MaxAbsDiff(outs[0], outs[2]), 0.0);
    EXPECT_EQ(MaxAbsDiff(outs[1], outs[3]), 0.0);
  }
}

TEST(Activation, NoInputGradientIsANoOp) {
  auto layer = MakeLayer("gelu", {}, {Shape{3}});
  Tensor x = RandomTensor(Shape{2, 3}, 1);
  Tensor y = RunForward(*layer, {x}, Shape{2, 3}, {});
  EXPECT_NO_THROW(layer->Backward({&x}, y, y, {nullptr}));
}

}  // namespace
}  // namespace cnnflow
