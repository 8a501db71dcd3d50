#include "ops/train/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "ops/error.h"

namespace cnnflow {

LrSchedule::LrSchedule(LrScheduleOptions options) : options_(std::move(options)) {
  const LrScheduleOptions& o = options_;
  if (o.decay != "constant" && o.decay != "step" && o.decay != "cosine" && o.decay != "piecewise") {
    std::string msg = StrCat("schedule: unknown decay '", o.decay, "'");
    const std::string close = ClosestMatch(o.decay, {"constant", "step", "cosine", "piecewise"});
    if (!close.empty()) msg += StrCat(" (did you mean '", close, "'?)");
    throw ConfigError(msg + "; known: constant, step, cosine, piecewise");
  }
  CheckPoints();
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

void LrSchedule::CheckPoints() const {
  const LrScheduleOptions& o = options_;
  const bool piecewise = o.decay == "piecewise";
  if (!piecewise) {
    if (!o.point_steps.empty() || !o.point_factors.empty()) {
      throw ConfigError(StrCat(
          "schedule: milestones and factors belong to decay: piecewise (decay is ", o.decay, ")"));
    }
    return;
  }
  if (o.point_steps.empty() || o.point_steps.size() != o.point_factors.size()) {
    throw ConfigError(
        StrCat("schedule: decay: piecewise needs as many milestones as factors, "
               "at least one (got ",
               o.point_steps.size(), " and ", o.point_factors.size(), ")"));
  }
  if (o.warmup_steps > 0) {
    throw ConfigError("schedule: decay: piecewise has its warmup in its points (warmup_epochs: 0)");
  }
  for (size_t i = 0; i < o.point_steps.size(); ++i) {
    if (!std::isfinite(o.point_steps[i]) || o.point_steps[i] < 0 ||
        (i > 0 && o.point_steps[i] < o.point_steps[i - 1])) {
      throw ConfigError(
          StrCat("schedule: milestones must be >= 0 and non-decreasing (milestone ", i + 1, ")"));
    }
    if (!std::isfinite(o.point_factors[i]) || o.point_factors[i] < 0) {
      throw ConfigError(StrCat("schedule: factors must be >= 0, got ", o.point_factors[i],
                               " (factor ", i + 1, ")"));
    }
  }
}

double LrSchedule::Piecewise(int64_t step) const {
  const std::vector<double>& x = options_.point_steps;
  const std::vector<double>& f = options_.point_factors;
  const auto s = static_cast<double>(step);
  if (s <= x.front()) return f.front();
  for (size_t i = 1; i < x.size(); ++i) {
    if (s < x[i]) return f[i - 1] + (f[i] - f[i - 1]) * (s - x[i - 1]) / (x[i] - x[i - 1]);
  }
  return f.back();
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
  if (o.decay == "piecewise") return o.base_lr * Piecewise(step);
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
      Schema(
          "Learning-rate schedule: a linear warmup, then a constant, step or cosine decay; "
          "or piecewise linear.")
          .Choice("decay", {"constant", "step", "cosine", "piecewise"}, "constant",
                  "decay after the warmup: constant, step (x gamma every step_epochs), "
                  "cosine (down to min_lr at the end of training), or piecewise (the lr "
                  "factors at the milestones, linear between them)")
          .Optional("warmup_epochs", ParamType::kFloat, 0.0,
                    "epochs of linear warmup (fractions allowed)")
          .Optional("warmup_start_factor", ParamType::kFloat, 0.0,
                    "lr at the start of the warmup, as a fraction of the base lr")
          .Optional("step_epochs", ParamType::kFloat, 0.0,
                    "step decay: epochs between multiplications by gamma")
          .Optional("gamma", ParamType::kFloat, 0.1, "step decay: the factor")
          .Optional("min_lr", ParamType::kFloat, 0.0, "cosine decay: the final lr")
          .Optional("milestones", ParamType::kFloatList, std::vector<double>{},
                    "piecewise: epochs (fractions allowed, non-decreasing) where the lr is "
                    "given")
          .Optional("factors", ParamType::kFloatList, std::vector<double>{},
                    "piecewise: the lr at each milestone, as a fraction of the base lr")
          .Choice("scale_lr", {"none", "linear"}, "none",
                  "linear: lr = lr * global_batch / base_batch (Goyal et al. 2017)")
          .Optional("base_batch", ParamType::kInt, int64_t{0},
                    "the batch the configured lr was tuned for (0: the configured batch)");
  return schema;
}

}  // namespace cnnflow
