#include "ops/train/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "ops/error.h"

namespace cnnflow {

LrSchedule::LrSchedule(LrScheduleOptions options) : options_(std::move(options)) {
  const LrScheduleOptions& o = options_;
  if (o.decay != "constant" && o.decay != "step" && o.decay != "cosine") {
    std::string msg = StrCat("schedule: unknown decay '", o.decay, "'");
    const std::string close = ClosestMatch(o.decay, {"constant", "step", "cosine"});
    if (!close.empty()) msg += StrCat(" (did you mean '", close, "'?)");
    throw ConfigError(msg + "; known: constant, step, cosine");
  }
  if (o.total_steps < 0 || o.warmup_steps < 0) {
    throw ConfigError(StrCat("schedule: total_steps (", o.total_steps, ") and warmup_steps (",
                             o.warmup_steps, ") must be >= 0"));
  }
  if (!(o.warmup_start_factor >= 0 && o.warmup_start_factor <= 1)) {
    throw ConfigError(
        StrCat("schedule: warmup_start_factor must be in [0, 1], got ", o.warmup_start_factor));
  }
  if (o.decay == "step" && o.step_size <= 0) {
    throw ConfigError(StrCat("schedule: step decay needs step_size > 0 steps, got ", o.step_size));
  }
  if (!std::isfinite(o.base_lr) || !std::isfinite(o.gamma) || !std::isfinite(o.min_lr)) {
    throw ConfigError("schedule: base_lr, gamma and min_lr must be finite");
  }
}

double LrSchedule::At(int64_t step) const {
  const LrScheduleOptions& o = options_;
  if (step < 0) step = 0;
  if (step < o.warmup_steps) {
    const double f = o.warmup_start_factor + (1.0 - o.warmup_start_factor) *
                                                 static_cast<double>(step) /
                                                 static_cast<double>(o.warmup_steps);
    return o.base_lr * f;
  }
  const int64_t s = step - o.warmup_steps;
  if (o.decay == "step") return o.base_lr * std::pow(o.gamma, static_cast<double>(s / o.step_size));
  if (o.decay == "cosine") {
    const int64_t span = o.total_steps - o.warmup_steps;
    if (span <= 0 || s >= span) return span <= 0 ? o.base_lr : o.min_lr;
    const double c =
        std::cos(std::numbers::pi * static_cast<double>(s) / static_cast<double>(span));
    return o.min_lr + (o.base_lr - o.min_lr) * (1.0 + c) / 2.0;
  }
  return o.base_lr;
}

double ScaleLr(double base_lr, int64_t global_batch, int64_t base_batch) {
  if (global_batch <= 0 || base_batch <= 0) {
    throw ConfigError(StrCat("scale_lr: batches must be positive (global batch ", global_batch,
                             ", base batch ", base_batch, ")"));
  }
  return base_lr * static_cast<double>(global_batch) / static_cast<double>(base_batch);
}

const Schema& LrScheduleSchema() {
  static const Schema schema =
      Schema("Learning-rate schedule: a linear warmup, then a constant, step or cosine decay.")
          .Choice("decay", {"constant", "step", "cosine"}, "constant",
                  "decay after the warmup: constant, step (x gamma every step_epochs) or "
                  "cosine (down to min_lr at the end of training)")
          .Optional("warmup_epochs", ParamType::kFloat, 0.0,
                    "epochs of linear warmup (fractions allowed)")
          .Optional("warmup_start_factor", ParamType::kFloat, 0.0,
                    "lr at the start of the warmup, as a fraction of the base lr")
          .Optional("step_epochs", ParamType::kFloat, 0.0,
                    "step decay: epochs between multiplications by gamma")
          .Optional("gamma", ParamType::kFloat, 0.1, "step decay: the factor")
          .Optional("min_lr", ParamType::kFloat, 0.0, "cosine decay: the final lr")
          .Choice("scale_lr", {"none", "linear"}, "none",
                  "linear: lr = lr * global_batch / base_batch (Goyal et al. 2017)")
          .Optional("base_batch", ParamType::kInt, int64_t{0},
                    "the batch the configured lr was tuned for (0: the configured batch)");
  return schema;
}

}  // namespace cnnflow
