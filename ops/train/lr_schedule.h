// Learning-rate schedules: a linear warmup followed by a constant, step or
// cosine decay, as a pure function of the global step (so a resumed run
// needs no schedule state), and the linear scaling rule for large batches.
// The YAML `schedule:` section is given in epochs; the caller converts
// epochs to steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/schema.h"

namespace cnnflow {

struct LrScheduleOptions {
  double base_lr = 0;
  std::string decay = "constant";  // constant | step | cosine | piecewise
  int64_t total_steps = 0;         // of the whole run, warmup included
  int64_t warmup_steps = 0;
  // The lr at step 0 is base_lr * warmup_start_factor, rising linearly to
  // base_lr at warmup_steps (torch.optim.lr_scheduler.LinearLR).
  double warmup_start_factor = 0.0;
  int64_t step_size = 0;  // step decay: multiply by gamma every step_size steps
  double gamma = 0.1;
  double min_lr = 0;  // cosine: the lr at total_steps
  // piecewise: the points (in steps, non-decreasing) where the lr is base *
  // the point's factor.
  std::vector<double> point_steps{}, point_factors{};
};

class LrSchedule {
 public:
  // Throws ConfigError for an unknown decay, negative counts, a step decay
  // without step_size > 0, or a warmup start factor outside [0, 1].
  explicit LrSchedule(LrScheduleOptions options);

  // The learning rate of step `step` (counted from 0). During warmup:
  // linear from base * warmup_start_factor. After it (s = step -
  // warmup_steps; the decay starts afresh, as torch's SequentialLR does):
  //   constant: base
  //   step:     base * gamma^floor(s / step_size)
  //   cosine:   min_lr + (base - min_lr) * (1 + cos(pi * s / (total - warmup))) / 2,
  //             held at min_lr from total_steps on.
  //   piecewise: base * the factors interpolated linearly between the points,
  //             held before the first and after the last (numpy.interp); the
  //             one-cycle and triangular schedules of the CIFAR speed runs.
  double At(int64_t step) const;
  const LrScheduleOptions& options() const { return options_; }

 private:
  void CheckPoints() const;
  double Piecewise(int64_t step) const;  // the factor at `step`

  LrScheduleOptions options_;
};

// The linear scaling rule (Goyal et al. 2017): base_lr * global_batch /
// base_batch. Throws ConfigError unless both batches are positive.
double ScaleLr(double base_lr, int64_t global_batch, int64_t base_batch);

// The schema of the YAML `schedule:` section (epochs, not steps).
const Schema& LrScheduleSchema();

}  // namespace cnnflow
