#include "ops/train/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>

#include "ops/error.h"

namespace cnnflow {
namespace {

TEST(LrSchedule, ConstantIsTheBaseEverywhere) {
  LrSchedule s({.base_lr = 0.1, .total_steps = 100});
  EXPECT_DOUBLE_EQ(s.At(0), 0.1);
  EXPECT_DOUBLE_EQ(s.At(99), 0.1);
  EXPECT_DOUBLE_EQ(s.At(1000), 0.1);
}

TEST(LrSchedule, LinearWarmupFromStartFactor) {
  LrSchedule s({.base_lr = 0.1, .total_steps = 100, .warmup_steps = 10});
  EXPECT_DOUBLE_EQ(s.At(0), 0.0);
  EXPECT_DOUBLE_EQ(s.At(5), 0.05);
  EXPECT_DOUBLE_EQ(s.At(9), 0.09);
  EXPECT_DOUBLE_EQ(s.At(10), 0.1);
  LrSchedule f({.base_lr = 0.2, .total_steps = 100, .warmup_steps = 4, .warmup_start_factor = 0.5});
  EXPECT_DOUBLE_EQ(f.At(0), 0.1);  // base * factor
  EXPECT_DOUBLE_EQ(f.At(2), 0.15);
  EXPECT_DOUBLE_EQ(f.At(4), 0.2);
}

TEST(LrSchedule, StepDecayMultipliesByGammaEveryStepSize) {
  LrSchedule s({.base_lr = 0.8, .decay = "step", .total_steps = 100, .step_size = 5, .gamma = 0.5});
  EXPECT_DOUBLE_EQ(s.At(0), 0.8);
  EXPECT_DOUBLE_EQ(s.At(4), 0.8);
  EXPECT_DOUBLE_EQ(s.At(5), 0.4);
  EXPECT_DOUBLE_EQ(s.At(9), 0.4);
  EXPECT_DOUBLE_EQ(s.At(10), 0.2);
  EXPECT_DOUBLE_EQ(s.At(17), 0.1);
}

TEST(LrSchedule, StepDecayCountsFromTheEndOfWarmup) {
  LrSchedule s({.base_lr = 0.8,
                .decay = "step",
                .total_steps = 100,
                .warmup_steps = 3,
                .step_size = 5,
                .gamma = 0.5});
  EXPECT_DOUBLE_EQ(s.At(3), 0.8);
  EXPECT_DOUBLE_EQ(s.At(7), 0.8);
  EXPECT_DOUBLE_EQ(s.At(8), 0.4);
}

TEST(LrSchedule, CosineRunsFromBaseToMinOverTheStepsAfterWarmup) {
  LrSchedule s(
      {.base_lr = 0.1, .decay = "cosine", .total_steps = 110, .warmup_steps = 10, .min_lr = 0.001});
  EXPECT_DOUBLE_EQ(s.At(5), 0.05);
  EXPECT_DOUBLE_EQ(s.At(10), 0.1);
  EXPECT_NEAR(s.At(60), (0.1 + 0.001) / 2, 1e-15);  // half way: cos(pi/2) = 0
  // A quarter of the way: min + (base - min) (1 + cos(pi/4)) / 2.
  EXPECT_NEAR(s.At(35), 0.001 + 0.099 * (1 + std::sqrt(0.5)) / 2, 1e-15);
  EXPECT_DOUBLE_EQ(s.At(110), 0.001);
  EXPECT_DOUBLE_EQ(s.At(500), 0.001);
  // Monotone after warmup.
  for (int64_t t = 11; t <= 110; ++t) EXPECT_LE(s.At(t), s.At(t - 1)) << t;
}

TEST(LrSchedule, CosineMatchesTorchClosedForm) {
  // torch CosineAnnealingLR(T_max=50, eta_min=0): base (1 + cos(pi t / 50)) / 2.
  LrSchedule s({.base_lr = 0.05, .decay = "cosine", .total_steps = 50});
  for (int64_t t = 0; t <= 50; t += 7)
    EXPECT_NEAR(s.At(t), 0.05 * (1 + std::cos(std::numbers::pi * t / 50.0)) / 2, 1e-16) << t;
}

TEST(LrSchedule, ScaleLrIsLinear) {
  EXPECT_DOUBLE_EQ(ScaleLr(0.1, 256, 64), 0.4);
  EXPECT_DOUBLE_EQ(ScaleLr(0.1, 32, 64), 0.05);
  EXPECT_THROW(ScaleLr(0.1, 256, 0), ConfigError);
}

TEST(LrSchedule, BadOptionsAreConfigErrors) {
  try {
    LrSchedule({.base_lr = 0.1, .decay = "cosin", .total_steps = 10});
    FAIL() << "no error for an unknown decay";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'cosine'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(LrSchedule({.base_lr = 0.1, .decay = "step", .total_steps = 10}), ConfigError);
  EXPECT_THROW(LrSchedule({.base_lr = 0.1, .total_steps = 10, .warmup_steps = -1}), ConfigError);
  EXPECT_THROW(LrSchedule({.base_lr = 0.1, .total_steps = 10, .warmup_start_factor = 2}),
               ConfigError);
}

TEST(LrSchedule, SchemaDocumentsTheYamlSection) {
  const Schema& s = LrScheduleSchema();
  ASSERT_NE(s.Find("decay"), nullptr);
  EXPECT_EQ(s.Find("decay")->choices,
            (std::vector<std::string>{"constant", "step", "cosine", "piecewise"}));
  ASSERT_NE(s.Find("scale_lr"), nullptr);
  EXPECT_EQ(s.Find("scale_lr")->choices, (std::vector<std::string>{"none", "linear"}));
  Args a;
  a.FillDefaults(s);
  EXPECT_EQ(a.String("decay"), "constant");
  EXPECT_DOUBLE_EQ(a.Float("warmup_epochs"), 0.0);
  EXPECT_DOUBLE_EQ(a.Float("gamma"), 0.1);
  EXPECT_EQ(a.Int("base_batch"), 0);
  EXPECT_TRUE(a.Floats("milestones").empty());
  EXPECT_TRUE(a.Floats("factors").empty());
}

// numpy.interp over the points, held outside them: the triangular and
// one-cycle schedules of the CIFAR speed runs.
TEST(LrSchedule, PiecewiseInterpolatesBetweenPointsAndHoldsOutside) {
  LrSchedule s({.base_lr = 2.0,
                .decay = "piecewise",
                .total_steps = 100,
                .point_steps = {10, 30, 50},
                .point_factors = {0.2, 1.0, 0.0}});
  EXPECT_DOUBLE_EQ(s.At(0), 0.4);  // before the first point: its factor
  EXPECT_DOUBLE_EQ(s.At(10), 0.4);
  EXPECT_DOUBLE_EQ(s.At(20), 2.0 * (0.2 + 0.8 * 10 / 20));
  EXPECT_DOUBLE_EQ(s.At(30), 2.0);
  EXPECT_DOUBLE_EQ(s.At(45), 2.0 * 0.25);
  EXPECT_DOUBLE_EQ(s.At(50), 0.0);
  EXPECT_DOUBLE_EQ(s.At(99), 0.0);  // after the last: its factor
  // Two points at one step: a jump, taken at that step.
  LrSchedule jump({.base_lr = 1.0,
                   .decay = "piecewise",
                   .total_steps = 10,
                   .point_steps = {0, 4, 4, 8},
                   .point_factors = {1.0, 1.0, 0.1, 0.1}});
  EXPECT_DOUBLE_EQ(jump.At(3), 1.0);
  EXPECT_DOUBLE_EQ(jump.At(4), 0.1);
  EXPECT_DOUBLE_EQ(jump.At(6), 0.1);
}

TEST(LrSchedule, PiecewiseRejectsBadPoints) {
  auto error = [](LrScheduleOptions o) {
    o.base_lr = 0.1;
    o.total_steps = 100;
    try {
      LrSchedule s(o);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error({.decay = "piecewise", .point_steps = {0, 10}, .point_factors = {1}})
                .find("as many milestones as factors"),
            std::string::npos);
  EXPECT_NE(error({.decay = "piecewise"}).find("at least one"), std::string::npos);
  EXPECT_NE(error({.decay = "piecewise", .point_steps = {10, 5}, .point_factors = {1, 0}})
                .find("non-decreasing (milestone 2)"),
            std::string::npos);
  EXPECT_NE(error({.decay = "piecewise", .point_steps = {0, 5}, .point_factors = {1, -0.5}})
                .find("factors must be >= 0, got -0.5 (factor 2)"),
            std::string::npos);
  EXPECT_NE(
      error(
          {.decay = "piecewise", .warmup_steps = 3, .point_steps = {0, 5}, .point_factors = {1, 0}})
          .find("warmup_epochs: 0"),
      std::string::npos);
  EXPECT_NE(error({.decay = "cosine", .point_steps = {0}, .point_factors = {1}})
                .find("belong to decay: piecewise"),
            std::string::npos);
}

}  // namespace
}  // namespace cnnflow
