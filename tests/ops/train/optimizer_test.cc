// Optimizers against hand-computed PyTorch updates: a 2-element parameter
// p0 = [1, -2], lr = 0.1, gradients g1 = [0.5, -1], g2 = [0.25, 0.5],
// g3 = [-0.5, 1] over three steps. The expected values follow from the
// torch.optim formulas (worked out in the comments; the Adam values were
// also checked against torch 1.13's torch.optim in float64).
#include "ops/train/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/isa.h"
#include "ops/cpu/optimizer_kernels.h"
#include "ops/train/adam.h"
#include "ops/train/sgd.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

const std::vector<std::vector<double>> kGrads = {{0.5, -1.0}, {0.25, 0.5}, {-0.5, 1.0}};
constexpr double kLr = 0.1;

Parameter MakeParam(std::vector<double> values, DType dtype = DType::kF64) {
  const Shape shape{static_cast<int64_t>(values.size())};
  Parameter p{"weight", Tensor::Zeros(shape, dtype), Tensor::Zeros(shape, dtype)};
  for (size_t i = 0; i < values.size(); ++i) p.value.Set(static_cast<int64_t>(i), values[i]);
  return p;
}

void SetGrad(Parameter& p, const std::vector<double>& g) {
  for (size_t i = 0; i < g.size(); ++i) p.grad.Set(static_cast<int64_t>(i), g[i]);
}

// Runs the three steps; returns p after each.
std::vector<std::vector<double>> RunSteps(Optimizer& opt, Parameter& p) {
  std::vector<std::vector<double>> out;
  for (const auto& g : kGrads) {
    SetGrad(p, g);
    opt.Step(kLr);
    out.push_back({p.value.At(0), p.value.At(1)});
  }
  return out;
}

void ExpectNear(const std::vector<std::vector<double>>& got,
                const std::vector<std::vector<double>>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < got.size(); ++s)
    for (size_t i = 0; i < got[s].size(); ++i)
      EXPECT_NEAR(got[s][i], want[s][i], tol) << "step " << s + 1 << " element " << i;
}

const Tensor* FindState(const Optimizer& opt, const std::string& name,
                        std::vector<std::pair<std::string, Tensor>>& holder) {
  holder = opt.StateTensors();
  for (const auto& [n, t] : holder)
    if (n == name) return &t;
  return nullptr;
}

TEST(Sgd, PlainStepsAreMinusLrTimesGrad) {
  Parameter p = MakeParam({1, -2});
  Sgd opt({{"fc.weight", &p}}, {});
  // p1 = p0 - 0.1 g1 = [0.95, -1.9]; p2 = [0.925, -1.95]; p3 = [0.975, -2.05]
  ExpectNear(RunSteps(opt, p), {{0.95, -1.9}, {0.925, -1.95}, {0.975, -2.05}}, 1e-12);
  EXPECT_TRUE(opt.StateTensors().empty());  // no momentum, no state (as PyTorch)
  EXPECT_EQ(opt.step_count(), 3);
}

TEST(Sgd, MomentumBufferStartsAtFirstGrad) {
  Parameter p = MakeParam({1, -2});
  Sgd opt({{"fc.weight", &p}}, {.momentum = 0.9});
  // buf1 = g1 = [0.5, -1]           p1 = [0.95, -1.9]
  // buf2 = 0.9 buf1 + g2 = [0.7, -0.4]   p2 = [0.88, -1.86]
  // buf3 = 0.9 buf2 + g3 = [0.13, 0.64]  p3 = [0.867, -1.924]
  ExpectNear(RunSteps(opt, p), {{0.95, -1.9}, {0.88, -1.86}, {0.867, -1.924}}, 1e-12);
  std::vector<std::pair<std::string, Tensor>> holder;
  const Tensor* buf = FindState(opt, "fc.weight.momentum_buffer", holder);
  ASSERT_NE(buf, nullptr);
  EXPECT_NEAR(buf->At(0), 0.13, 1e-12);
  EXPECT_NEAR(buf->At(1), 0.64, 1e-12);
}

TEST(Sgd, DampeningScalesNewGradsButNotTheFirst) {
  Parameter p = MakeParam({1, -2});
  Sgd opt({{"w", &p}}, {.momentum = 0.9, .dampening = 0.5});
  // buf1 = g1 (no dampening on the first step)            p1 = [0.95, -1.9]
  // buf2 = 0.9 [0.5, -1] + 0.5 [0.25, 0.5] = [0.575, -0.65]  p2 = [0.8925, -1.835]
  // buf3 = 0.9 buf2 + 0.5 [-0.5, 1] = [0.2675, -0.085]    p3 = [0.86575, -1.8265]
  ExpectNear(RunSteps(opt, p), {{0.95, -1.9}, {0.8925, -1.835}, {0.86575, -1.8265}}, 1e-12);
}

TEST(Sgd, NesterovLooksAhead) {
  Parameter p = MakeParam({1, -2});
  Sgd opt({{"w", &p}}, {.momentum = 0.9, .nesterov = true});
  // update = g + 0.9 buf (buf as in the momentum test):
  // u1 = [0.5, -1] + 0.9 [0.5, -1] = [0.95, -1.9]      p1 = [0.905, -1.81]
  // u2 = [0.25, 0.5] + 0.9 [0.7, -0.4] = [0.88, 0.14]  p2 = [0.817, -1.824]
  // u3 = [-0.5, 1] + 0.9 [0.13, 0.64] = [-0.383, 1.576] p3 = [0.8553, -1.9816]
  ExpectNear(RunSteps(opt, p), {{0.905, -1.81}, {0.817, -1.824}, {0.8553, -1.9816}}, 1e-12);
}

TEST(Sgd, WeightDecayIsAddedToTheGrad) {
  Parameter p = MakeParam({1, -2});
  Sgd opt({{"w", &p}}, {.momentum = 0.9, .weight_decay = 0.1});
  // g1' = g1 + 0.1 p0 = [0.6, -1.2] = buf1               p1 = [0.94, -1.88]
  // g2' = [0.25 + 0.094, 0.5 - 0.188] = [0.344, 0.312]
  // buf2 = 0.9 [0.6, -1.2] + g2' = [0.884, -0.768]        p2 = [0.8516, -1.8032]
  // g3' = [-0.5 + 0.08516, 1 - 0.18032] = [-0.41484, 0.81968]
  // buf3 = 0.9 buf2 + g3' = [0.38076, 0.12848]            p3 = [0.813524, -1.816048]
  ExpectNear(RunSteps(opt, p), {{0.94, -1.88}, {0.8516, -1.8032}, {0.813524, -1.816048}}, 1e-12);
}

TEST(Sgd, RejectsNesterovWithoutMomentumOrWithDampening) {
  Parameter p = MakeParam({1, -2});
  EXPECT_THROW(Sgd({{"w", &p}}, {.nesterov = true}), ConfigError);
  EXPECT_THROW(Sgd({{"w", &p}}, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}),
               ConfigError);
  EXPECT_THROW(Sgd({{"w", &p}}, {.momentum = -1}), ConfigError);
}

TEST(Sgd, Float32MatchesFloat64) {
  Parameter p = MakeParam({1, -2}, DType::kF32);
  Sgd opt({{"w", &p}}, {.momentum = 0.9, .nesterov = true});
  ExpectNear(RunSteps(opt, p), {{0.905, -1.81}, {0.817, -1.824}, {0.8553, -1.9816}}, 1e-6);
}

TEST(Sgd, LargeParameterIsUpdatedEverywhere) {
  // Bigger than one parallel grain: every element must see the update.
  const int64_t n = 100003;
  Parameter p{"w", Tensor::Full({n}, 1.0), Tensor::Full({n}, 0.5)};
  Sgd opt({{"w", &p}}, {.momentum = 0.9});
  opt.Step(kLr);
  p.grad = Tensor::Full({n}, 0.25);
  opt.Step(kLr);
  // buf2 = 0.9 * 0.5 + 0.25 = 0.7; p2 = 1 - 0.05 - 0.07 = 0.88
  const float* v = p.value.data<float>();
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(v[i], 0.88f, 1e-6f) << i;
}

TEST(Sgd, MixedDtypesAndSeveralParameters) {
  Parameter a = MakeParam({1, -2}, DType::kF32);
  Parameter b = MakeParam({1, -2}, DType::kF64);
  Sgd opt({{"a", &a}, {"b", &b}}, {.momentum = 0.9});
  for (const auto& g : kGrads) {
    SetGrad(a, g);
    SetGrad(b, g);
    opt.Step(kLr);
  }
  EXPECT_NEAR(a.value.At(0), 0.867, 1e-6);
  EXPECT_NEAR(b.value.At(1), -1.924, 1e-12);
  const auto state = opt.StateTensors();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "a.momentum_buffer");
  EXPECT_EQ(state[0].second.dtype(), DType::kF32);
  EXPECT_EQ(state[1].first, "b.momentum_buffer");
  EXPECT_EQ(state[1].second.dtype(), DType::kF64);
}

TEST(Sgd, ResumeFromStateTensorsContinuesExactly) {
  Parameter p = MakeParam({1, -2});
  Sgd opt({{"w", &p}}, {.momentum = 0.9});
  SetGrad(p, kGrads[0]);
  opt.Step(kLr);
  SetGrad(p, kGrads[1]);
  opt.Step(kLr);
  // A checkpoint: copies of the parameter and the state.
  Parameter q{"weight", p.value.Clone(), Tensor::Zeros({2}, DType::kF64)};
  std::vector<std::pair<std::string, Tensor>> saved;
  for (const auto& [n, t] : opt.StateTensors()) saved.emplace_back(n, t.Clone());
  saved.emplace_back("unrelated.tensor", Tensor::Zeros({3}));
  Sgd resumed({{"w", &q}}, {.momentum = 0.9});
  EXPECT_EQ(resumed.LoadStateTensors(saved), 1);
  resumed.set_step_count(opt.step_count());
  SetGrad(p, kGrads[2]);
  SetGrad(q, kGrads[2]);
  opt.Step(kLr);
  resumed.Step(kLr);
  EXPECT_EQ(q.value.At(0), p.value.At(0));
  EXPECT_EQ(q.value.At(1), p.value.At(1));
  EXPECT_EQ(resumed.step_count(), 3);
}

TEST(Adam, BiasCorrectionMakesTheFirstStepLrTimesSign) {
  Parameter p = MakeParam({1, -2});
  Adam opt({{"w", &p}}, {});
  // Step 1: m = 0.1 g, v = 0.001 g^2; corrected m^ = g, v^ = g^2, so
  // p1 = p0 - 0.1 g / (|g| + 1e-8) = [0.9 + 2e-9, -1.9 - 1e-9].
  // Steps 2 and 3 (same formulas; checked against torch.optim.Adam):
  ExpectNear(RunSteps(opt, p),
             {{0.900000002, -1.900000001},
              {0.8067820404774624, -1.873366297370903},
              {0.7957037336010943, -1.9006359761506924}},
             1e-12);
  std::vector<std::pair<std::string, Tensor>> holder;
  // m3 = 0.9 (0.9 (0.1 g1) + 0.1 g2) + 0.1 g3 = [0.013, 0.064]
  const Tensor* m = FindState(opt, "w.exp_avg", holder);
  ASSERT_NE(m, nullptr);
  EXPECT_NEAR(m->At(0), 0.013, 1e-15);
  EXPECT_NEAR(m->At(1), 0.064, 1e-15);
  // v3 = 0.999^2 0.001 g1^2 + 0.999 0.001 g2^2 + 0.001 g3^2
  const Tensor* v = FindState(opt, "w.exp_avg_sq", holder);
  ASSERT_NE(v, nullptr);
  EXPECT_NEAR(v->At(0), 0.999 * 0.999 * 0.001 * 0.25 + 0.999 * 0.001 * 0.0625 + 0.001 * 0.25,
              1e-15);
  EXPECT_NEAR(v->At(1), 0.999 * 0.999 * 0.001 * 1.0 + 0.999 * 0.001 * 0.25 + 0.001 * 1.0, 1e-15);
}

TEST(Adam, SecondStepByHand) {
  // Step 2 written out for element 0: m2 = 0.9 * 0.05 + 0.1 * 0.25 = 0.07,
  // v2 = 0.999 * 0.00025 + 0.001 * 0.0625 = 0.00031225,
  // p2 = p1 - 0.1 / (1 - 0.81) * m2 / (sqrt(v2) / sqrt(1 - 0.998001) + 1e-8).
  Parameter p = MakeParam({1, -2});
  Adam opt({{"w", &p}}, {});
  auto got = RunSteps(opt, p);
  const double p1 = 1 - 0.1 * 0.5 / (0.5 + 1e-8);
  const double p2 = p1 - 0.1 / 0.19 * 0.07 / (std::sqrt(0.00031225) / std::sqrt(0.001999) + 1e-8);
  EXPECT_NEAR(got[1][0], p2, 1e-12);
}

TEST(Adam, WeightDecayIsL2OnTheGrad) {
  Parameter p = MakeParam({1, -2});
  Adam opt({{"w", &p}}, {.weight_decay = 0.1});
  // g1' = g1 + 0.1 p0 = [0.6, -1.2]: the first step is still lr * sign:
  // p1 = [1 - 0.1 * 0.6 / (0.6 + 1e-8), ...] (then as torch.optim.Adam).
  ExpectNear(RunSteps(opt, p),
             {{0.9000000016666666, -1.9000000008333333},
              {0.8050097658613199, -1.8537472646427609},
              {0.775511505150508, -1.858989405431774}},
             1e-12);
}

TEST(Adam, Float32MatchesFloat64) {
  Parameter p = MakeParam({1, -2}, DType::kF32);
  Adam opt({{"w", &p}}, {});
  ExpectNear(RunSteps(opt, p),
             {{0.900000002, -1.900000001},
              {0.8067820404774624, -1.873366297370903},
              {0.7957037336010943, -1.9006359761506924}},
             2e-6);
}

// Many elements (parallel ranges, vector blocks and a scalar tail) against
// a naive per-element loop of the torch formulas, for both dtypes.
TEST(Adam, LargeParameterMatchesNaiveFormulas) {
  const int64_t n = 100003;
  for (DType dtype : {DType::kF32, DType::kF64}) {
    for (bool decoupled : {false, true}) {
      Parameter p{"w", Tensor::Empty({n}, dtype), Tensor::Empty({n}, dtype)};
      std::vector<double> ref_p(n), ref_m(n, 0), ref_v(n, 0);
      for (int64_t i = 0; i < n; ++i) {
        ref_p[i] = std::sin(0.01 * static_cast<double>(i));
        p.value.Set(i, ref_p[i]);
      }
      const AdamOptions o{.beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.05};
      Adam opt({{"w", &p}}, o, decoupled);
      for (int t = 1; t <= 3; ++t) {
        std::vector<double> g(n);
        for (int64_t i = 0; i < n; ++i) {
          g[i] = std::cos(0.003 * static_cast<double>(i) * t) - 0.2 * t;
          p.grad.Set(i, g[i]);
        }
        opt.Step(0.01 * t);
        const double lr = 0.01 * t;
        for (int64_t i = 0; i < n; ++i) {
          if (decoupled) ref_p[i] *= 1 - lr * o.weight_decay;
          const double gi = decoupled ? g[i] : g[i] + o.weight_decay * ref_p[i];
          ref_m[i] = o.beta1 * ref_m[i] + (1 - o.beta1) * gi;
          ref_v[i] = o.beta2 * ref_v[i] + (1 - o.beta2) * gi * gi;
          const double denom = std::sqrt(ref_v[i]) / std::sqrt(1 - std::pow(o.beta2, t)) + o.eps;
          ref_p[i] -= lr / (1 - std::pow(o.beta1, t)) * ref_m[i] / denom;
        }
      }
      const double tol = dtype == DType::kF32 ? 2e-6 : 1e-13;
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(p.value.At(i), ref_p[i], tol) << i << " " << DTypeName(dtype) << decoupled;
    }
  }
}

TEST(Adam, RejectsBadBetas) {
  Parameter p = MakeParam({1, -2});
  EXPECT_THROW(Adam({{"w", &p}}, {.beta1 = 1.0}), ConfigError);
  EXPECT_THROW(Adam({{"w", &p}}, {.beta2 = -0.1}), ConfigError);
  EXPECT_THROW(Adam({{"w", &p}}, {.eps = -1}), ConfigError);
}

TEST(AdamW, DecayIsDecoupledFromTheMoments) {
  Parameter p = MakeParam({1, -2});
  AdamW opt({{"w", &p}}, {.weight_decay = 0.1});
  // p is first shrunk by 1 - lr * wd = 0.99, then the plain Adam update
  // (moments of the raw gradient): p1 = 0.99 p0 - 0.1 g1 / (|g1| + 1e-8)
  // = [0.89 + 2e-9, -1.88 - 1e-9].
  ExpectNear(RunSteps(opt, p),
             {{0.890000002, -1.880000001},
              {0.7878820404574624, -1.8345662973609032},
              {0.7689249131765196, -1.8434903131670834}},
             1e-12);
  // The moments are those of plain Adam: the decay never enters them.
  std::vector<std::pair<std::string, Tensor>> holder;
  const Tensor* m = FindState(opt, "w.exp_avg", holder);
  ASSERT_NE(m, nullptr);
  EXPECT_NEAR(m->At(0), 0.013, 1e-15);
  EXPECT_STREQ(opt.type(), "adamw");
}

TEST(AdamW, CustomBetasAndEps) {
  Parameter p = MakeParam({1, -2});
  AdamW opt({{"w", &p}}, {.beta1 = 0.5, .beta2 = 0.75, .eps = 1e-3, .weight_decay = 0.5});
  // Step 1: p1 = 0.95 p0 - 0.1 g / (|g| + 1e-3) = [0.95 - 0.05/0.501, -1.9 + 0.1/1.001].
  ExpectNear(RunSteps(opt, p),
             {{0.95 - 0.05 / 0.501, -1.9 + 0.1 / 1.001},
              {0.7197306280100474, -1.710094905094905},
              {0.7165125900989924, -1.6902023973152331}},
             1e-12);
}

TEST(AdamW, FactoryDefaultsToWeightDecay001) {
  Parameter p = MakeParam({1, -2});
  auto opt = MakeOptimizer("adamw", Args(), {{"w", &p}});
  EXPECT_STREQ(opt->type(), "adamw");
  SetGrad(p, kGrads[0]);
  opt->Step(kLr);
  // 0.999 p0 - 0.1 sign(g1) (up to eps).
  EXPECT_NEAR(p.value.At(0), 0.999 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-12);
  EXPECT_NEAR(p.value.At(1), -1.998 + 0.1 * 1.0 / (1.0 + 1e-8), 1e-12);
}

TEST(Sgd, FactoryReadsTheSchema) {
  Parameter p = MakeParam({1, -2});
  Args args;
  args.Set("lr", 0.5);  // the base lr: documented, used by the schedule, not here
  args.Set("momentum", 0.9);
  args.Set("nesterov", true);
  auto opt = MakeOptimizer("sgd", args, {{"w", &p}});
  EXPECT_NEAR(RunSteps(*opt, p)[2][1], -1.9816, 1e-12);
  const Schema& s = OptimizerSchema("sgd");
  ASSERT_NE(s.Find("lr"), nullptr);
  EXPECT_FALSE(s.Find("lr")->default_value.has_value());  // required
  for (const char* name : {"momentum", "dampening", "nesterov", "weight_decay"})
    EXPECT_NE(s.Find(name), nullptr) << name;
  EXPECT_EQ(OptimizerTypes(), (std::vector<std::string>{"adam", "adamw", "sgd"}));
}

// A type registers itself as layers, stages and sources do; its args reach
// its factory checked and with the schema's defaults.
TEST(OptimizerRegistry, ATypeRegisteredByNameIsMadeByMakeOptimizer) {
  static const RegisterIn<OptimizerType> plain(
      "test_plain_sgd",
      {Schema("a test type")
           .Required("lr", ParamType::kFloat, "lr")
           .Optional("momentum", ParamType::kFloat, 0.25, "m"),
       [](const Args& a, std::vector<NamedParameter> params) -> std::unique_ptr<Optimizer> {
         SgdOptions o;
         o.momentum = a.Float("momentum");  // the default, filled in
         return std::make_unique<Sgd>(std::move(params), o);
       }});
  Parameter p = MakeParam({1, -2});
  Args args;
  args.Set("lr", 0.1);
  auto opt = MakeOptimizer("test_plain_sgd", args, {{"w", &p}});
  EXPECT_STREQ(opt->type(), "sgd");
  EXPECT_DOUBLE_EQ(static_cast<Sgd&>(*opt).options().momentum, 0.25);
  const std::vector<std::string> types = OptimizerTypes();
  EXPECT_NE(std::find(types.begin(), types.end(), "test_plain_sgd"), types.end());
  args.Set("momentun", 0.5);
  EXPECT_THROW(MakeOptimizer("test_plain_sgd", args, {{"w", &p}}), ConfigError);
}

// The host update loops (ops/cpu/optimizer_kernels.cc) give the same bits
// under every ISA this CPU has: Adam's vector square roots are correctly
// rounded, as the scalar one.
TEST(OptimizerKernels, AdamIsBitwiseTheSameUnderEveryIsa) {
  const cpu::Isa machine = cpu::MaxIsa();
  std::vector<std::vector<float>> results;
  for (int isa = 0; isa <= static_cast<int>(cpu::CpuIsa()); ++isa) {
    cpu::SetMaxIsa(static_cast<cpu::Isa>(isa));
    const int64_t n = 1000;  // not a multiple of any vector width
    std::vector<float> p(n), g(n), m(n, 0.f), v(n, 0.f);
    for (int64_t i = 0; i < n; ++i) {
      p[i] = std::sin(0.1f * i);
      g[i] = std::cos(0.37f * i) * (i % 7 == 0 ? 1e-4f : 1.f);
    }
    cpu::AdamScalars s{1 - 1e-3 * 0.01,     0, 0.9, 0.999, 1e-8, 1e-3 / (1 - 0.9),
                       std::sqrt(1 - 0.999)};
    for (int step = 0; step < 3; ++step)
      cpu::AdamUpdate<float>(p.data(), g.data(), m.data(), v.data(), n, s);
    results.push_back(p);
  }
  cpu::SetMaxIsa(machine);
  for (size_t k = 1; k < results.size(); ++k)
    EXPECT_EQ(results[k], results[0]) << cpu::IsaName(static_cast<cpu::Isa>(k)) << " vs scalar";
}

TEST(Sgd, FactoryErrorsNameTypesAndCloseMatches) {
  Parameter p = MakeParam({1, -2});
  try {
    MakeOptimizer("sgdm", Args(), {{"w", &p}});
    FAIL() << "no error for an unknown type";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'sgd'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("adam, adamw, sgd"), std::string::npos) << e.what();
  }
  Args args;
  args.Set("momentun", 0.9);
  try {
    MakeOptimizer("sgd", args, {{"w", &p}});
    FAIL() << "no error for an unknown parameter";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'momentum'"), std::string::npos) << e.what();
  }
}

TEST(Adam, ResumeRejectsIncompleteState) {
  Parameter p = MakeParam({1, -2});
  Adam opt({{"w", &p}}, {});
  std::vector<std::pair<std::string, Tensor>> partial = {{"w.exp_avg", Tensor::Zeros({2})}};
  EXPECT_THROW(opt.LoadStateTensors(partial), Error);
  std::vector<std::pair<std::string, Tensor>> wrong = {{"w.exp_avg", Tensor::Zeros({3})},
                                                       {"w.exp_avg_sq", Tensor::Zeros({3})}};
  EXPECT_THROW(opt.LoadStateTensors(wrong), Error);
}

TEST(Adam, ResumeFromStateTensorsContinuesExactly) {
  Parameter p = MakeParam({1, -2});
  Adam opt({{"w", &p}}, {});
  SetGrad(p, kGrads[0]);
  opt.Step(kLr);
  SetGrad(p, kGrads[1]);
  opt.Step(kLr);
  Parameter q{"weight", p.value.Clone(), Tensor::Zeros({2}, DType::kF64)};
  std::vector<std::pair<std::string, Tensor>> saved;
  for (const auto& [n, t] : opt.StateTensors()) saved.emplace_back(n, t.Clone());
  Adam resumed({{"w", &q}}, {});
  EXPECT_EQ(resumed.LoadStateTensors(saved), 2);
  resumed.set_step_count(2);  // bias correction depends on it
  SetGrad(p, kGrads[2]);
  SetGrad(q, kGrads[2]);
  opt.Step(kLr);
  resumed.Step(kLr);
  EXPECT_EQ(q.value.At(0), p.value.At(0));
  EXPECT_EQ(q.value.At(1), p.value.At(1));
}

// ---------------------------------------------------------------- parameter groups

// A parameter group is an optimizer with its own values (torch.optim's
// param_groups): three tensors, two in groups, must step bitwise as three
// optimizers each configured with their group's lr and weight decay.
struct GroupCase {
  std::string type;
  Args args;  // the optimizer's: lr is the caller's, weight_decay 0.1
};

std::vector<GroupCase> GroupCases() {
  auto with = [](std::string type, std::vector<std::pair<std::string, ParamValue>> values) {
    Args a;
    for (auto& [k, v] : values) a.Set(k, v);
    a.Set("lr", 0.1);
    a.Set("weight_decay", 0.1);
    return GroupCase{std::move(type), a};
  };
  return {with("sgd", {{"momentum", 0.85}, {"nesterov", true}}), with("adam", {}),
          with("adamw", {})};
}

TEST(ParamGroups, EachGroupStepsAsAnOptimizerWithItsValues) {
  for (const GroupCase& c : GroupCases()) {
    SCOPED_TRACE(c.type);
    Parameter w = MakeParam({1, -2}), b = MakeParam({0.5, 0.25}), v = MakeParam({-1, 3});
    std::vector<ParamGroup> groups(2);
    groups[0].params = {"*.bias"};
    groups[0].lr_scale = 64;
    groups[0].weight_decay = 0.0;
    groups[1].layer_types = {"linear"};
    groups[1].weight_decay = 0.5;
    auto grouped = MakeOptimizer({c.type, c.args, groups}, {{"bn.weight", &w, "batchnorm"},
                                                            {"bn.bias", &b, "batchnorm"},
                                                            {"fc.weight", &v, "linear"}});
    EXPECT_EQ(grouped->group(0), -1);
    EXPECT_EQ(grouped->group(1), 0);
    EXPECT_EQ(grouped->group(2), 1);

    // The references: one optimizer per tensor, each with its group's values.
    Parameter w1 = MakeParam({1, -2}), b1 = MakeParam({0.5, 0.25}), v1 = MakeParam({-1, 3});
    Args bias_args = c.args, fc_args = c.args;
    bias_args.Set("weight_decay", 0.0);
    fc_args.Set("weight_decay", 0.5);
    auto for_w = MakeOptimizer(c.type, c.args, {{"w", &w1}});
    auto for_b = MakeOptimizer(c.type, bias_args, {{"b", &b1}});
    auto for_v = MakeOptimizer(c.type, fc_args, {{"v", &v1}});
    for (size_t s = 0; s < kGrads.size(); ++s) {
      const double lr = kLr * (s + 1);  // the schedule moves it
      for (Parameter* p : {&w, &b, &v, &w1, &b1, &v1}) SetGrad(*p, kGrads[s]);
      grouped->Step(lr);
      for_w->Step(lr);
      for_b->Step(64 * lr);
      for_v->Step(lr);
    }
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(w.value.At(i), w1.value.At(i)) << i;
      EXPECT_EQ(b.value.At(i), b1.value.At(i)) << i;
      EXPECT_EQ(v.value.At(i), v1.value.At(i)) << i;
    }
    EXPECT_NE(b.value.At(0), 0.5);  // it trained
  }
}

TEST(ParamGroups, OneStepByHand) {
  // Plain SGD, lr 0.1, weight decay 0.1; the bias group has lr x2 and no
  // decay: w = 1 - 0.1 (0.5 + 0.1 * 1) = 0.94; b = 1 - 0.2 * 0.5 = 0.9.
  Parameter w = MakeParam({1}), b = MakeParam({1});
  Args a;
  a.Set("lr", 0.1);
  a.Set("weight_decay", 0.1);
  ParamGroup g;
  g.params = {"*.bias"};
  g.lr_scale = 2;
  g.weight_decay = 0.0;
  auto opt = MakeOptimizer({"sgd", a, {g}}, {{"fc.weight", &w}, {"fc.bias", &b}});
  SetGrad(w, {0.5});
  SetGrad(b, {0.5});
  opt->Step(0.1);
  EXPECT_NEAR(w.value.At(0), 0.94, 1e-15);
  EXPECT_NEAR(b.value.At(0), 0.9, 1e-15);
}

// A group with until_step k trains its tensors in steps 1..k; from then on
// they are held (Parameter::held), so no backward computes their gradient,
// and a resume at any step count sets the same.
TEST(ParamGroups, TensorsPastUntilStepAreHeld) {
  Parameter w = MakeParam({1}), b = MakeParam({1});
  Args a;
  a.Set("lr", 0.1);
  ParamGroup g;
  g.params = {"*.bias"};
  g.until_step = 2;
  auto opt = MakeOptimizer({"sgd", a, {g}}, {{"fc.weight", &w}, {"fc.bias", &b}});
  std::vector<bool> held;
  for (int step = 1; step <= 3; ++step) {
    held.push_back(b.held);
    SetGrad(w, {0.5});
    SetGrad(b, {0.5});
    opt->Step(0.1);
  }
  held.push_back(b.held);
  EXPECT_EQ(held, (std::vector<bool>{false, false, true, true}));
  EXPECT_FALSE(w.held);
  EXPECT_NEAR(b.value.At(0), 1 - 2 * 0.1 * 0.5, 1e-15);  // steps 1 and 2 only
  opt->set_step_count(1);
  EXPECT_FALSE(b.held);
  opt->set_step_count(2);
  EXPECT_TRUE(b.held);
}

TEST(ParamGroups, TheFirstGroupThatPicksATensorHasIt) {
  Parameter w = MakeParam({1}), b = MakeParam({1}), g = MakeParam({1});
  std::vector<ParamGroup> groups(3);
  groups[0].params = {"layer1.*"};
  groups[0].layer_types = {"batchnorm"};  // both must match
  groups[1].params = {"*.bias", "*.gamma"};
  groups[2].layer_types = {"conv2d"};
  Args a;
  a.Set("lr", 0.1);
  auto opt = MakeOptimizer({"sgd", a, groups}, {{"layer1.conv.bias", &w, "conv2d"},
                                                {"layer1.bn.bias", &b, "batchnorm"},
                                                {"ls.gamma", &g, "layer_scale"}});
  EXPECT_EQ(opt->group(0), 1);  // layer1.* but not batchnorm; then *.bias
  EXPECT_EQ(opt->group(1), 0);
  EXPECT_EQ(opt->group(2), 1);
}

TEST(ParamGroups, AGroupThatPicksNothingOrBadValuesIsAConfigError) {
  Parameter w = MakeParam({1}), f = MakeParam({1});
  f.trainable = false;
  const std::vector<NamedParameter> params = {{"fc.weight", &w, "linear"},
                                              {"bn.weight", &f, "batchnorm"}};
  ParamGroup typo;
  typo.params = {"fc.bais"};
  typo.where = "x.yaml:7:5: train.param_groups[0]";
  const std::string none = testing::ErrorOf<ConfigError>([&] { CheckParamGroups({typo}, params); });
  testing::ExpectContains(
      none, {"x.yaml:7:5: train.param_groups[0] picks no tensor", "fc.weight (linear)"});
  ParamGroup frozen;  // a group of frozen tensors is allowed, and said
  frozen.layer_types = {"batchnorm"};
  frozen.where = "g";
  const std::vector<std::string> notes = CheckParamGroups({frozen}, params);
  ASSERT_EQ(notes.size(), 1u);
  testing::ExpectContains(notes[0], {"g picks only frozen tensors (bn.weight (batchnorm))",
                                     "the group changes nothing"});
  ParamGroup negative;
  negative.params = {"fc.*"};
  negative.weight_decay = -0.1;
  negative.where = "g1";
  testing::ExpectContains(
      testing::ErrorOf<ConfigError>([&] { CheckParamGroups({negative}, params); }),
      {"g1: weight_decay must be >= 0, got -0.1"});
  ParamGroup nan_scale;
  nan_scale.params = {"fc.*"};
  nan_scale.lr_scale = std::nan("");
  nan_scale.where = "g2";
  testing::ExpectContains(
      testing::ErrorOf<ConfigError>([&] { CheckParamGroups({nan_scale}, params); }),
      {"g2: lr_scale must be >= 0"});
}

}  // namespace
}  // namespace cnnflow
