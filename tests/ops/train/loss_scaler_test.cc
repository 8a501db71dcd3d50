// Dynamic loss scaling (ops/train/loss_scaler.h), on the CPU: the behaviour the
// GPU's mixed-precision step relies on.
#include "ops/train/loss_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace cnnflow {
namespace {

TEST(LossScaler, SkipsAndBacksOffOnOverflowGrowsAfterTheInterval) {
  LossScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  LossScaler s(o);
  EXPECT_FALSE(s.Update(true));  // overflow: skip, halve
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.Update(false));
  EXPECT_TRUE(s.Update(false));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.Update(false));  // third good step in a row: double
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.Update(false));
  EXPECT_FALSE(s.Update(true));  // an overflow resets the run of good steps
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.Update(false));
  EXPECT_TRUE(s.Update(false));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.skipped_steps(), 2);
}

TEST(LossScaler, NeverGoesBelowTheMinimum) {
  LossScalerOptions o;
  o.init_scale = 4;
  LossScaler s(o);
  for (int i = 0; i < 10; ++i) s.Update(true);
  EXPECT_EQ(s.scale(), 1);
}

TEST(LossScaler, UnscaleDividesAndFindsInfAndNan) {
  LossScalerOptions o;
  o.init_scale = 8;
  LossScaler s(o);
  Tensor a = Tensor::Full(Shape({3}), 16.0, DType::kF32);
  Tensor b = Tensor::Full(Shape({2}), -4.0, DType::kF64);
  EXPECT_FALSE(s.Unscale({&a, &b}));
  EXPECT_EQ(a.At(0), 2.0);
  EXPECT_EQ(b.At(1), -0.5);
  a.Set(1, std::numeric_limits<double>::infinity());
  EXPECT_TRUE(s.Unscale({&a}));
  b.Set(0, std::nan(""));
  EXPECT_TRUE(s.Unscale({&b}));
}

// A fp16-like overflow: gradients of a scaled loss exceed the half range
// until the scale has backed off enough, then steps resume.
TEST(LossScaler, BacksOffUntilTheScaledGradientsFit) {
  LossScaler s;  // 65536
  const double true_grad = 2.0, half_max = 65504.0;
  int skipped = 0;
  for (int step = 0; step < 20; ++step) {
    const double scaled = true_grad * s.scale();
    const bool overflow = scaled > half_max;
    if (!s.Update(overflow)) ++skipped;
  }
  // 2 x 65536 and 2 x 32768 = 65536 overflow the half range; 2 x 16384 fits.
  EXPECT_EQ(skipped, 2);
  EXPECT_EQ(s.scale(), 16384);
}

}  // namespace
}  // namespace cnnflow
