#include "ops/train/weight_average.h"

#include <algorithm>
#include <cmath>

#include "ops/device_ops.h"

namespace cnnflow {

WeightAverage::WeightAverage(Model& model, double decay, bool warmup,
                             WeightAverageSchedule schedule)
    : decay_(decay), warmup_(warmup), schedule_(schedule) {
  if (!(decay >= 0 && decay < 1)) {
    throw ConfigError(StrCat("ema: decay must be in [0, 1), got ", decay));
  }
  if (schedule.every < 1 || schedule.start_step < 0 || !(schedule.ramp_power >= 0)) {
    throw ConfigError(StrCat("ema: every must be >= 1, the start and ramp >= 0 (got every ",
                             schedule.every, ", start step ", schedule.start_step, ", ramp ",
                             schedule.ramp_power, ")"));
  }
  for (auto& [name, t] : model.StateTensors()) tensors_.emplace_back(kEmaPrefix + name, t.Clone());
}

void WeightAverage::Update(Model& model) { UpdateWith(model, decay_); }

bool WeightAverage::UpdateAfter(Model& model, int64_t steps) {
  const WeightAverageSchedule& s = schedule_;
  if (steps < s.start_step || steps % s.every != 0) return false;
  double d = decay_;
  if (s.ramp_power > 0 && s.total_steps > 0) {
    const double f = std::min(1.0, static_cast<double>(steps) / static_cast<double>(s.total_steps));
    d *= std::pow(f, s.ramp_power);
  }
  UpdateWith(model, d);
  return true;
}

void WeightAverage::CopyTo(Model& model) const {
  auto current = model.StateTensors();
  CNNFLOW_ENFORCE(current.size() == tensors_.size(), "ema: the model changed shape");
  for (size_t i = 0; i < current.size(); ++i) current[i].second.CopyFrom(tensors_[i].second);
}

std::unique_ptr<WeightAverage> WeightAverage::CopyFor(Model& model) const {
  auto copy = std::make_unique<WeightAverage>(model, decay_, warmup_, schedule_);
  copy->Load(tensors_, updates_, "ema");
  return copy;
}

void WeightAverage::UpdateWith(Model& model, double decay) {
  const auto current = model.StateTensors();
  CNNFLOW_ENFORCE(current.size() == tensors_.size(), "ema: the model changed shape");
  const double t = static_cast<double>(updates_);
  const double d = warmup_ ? std::min(decay, (1 + t) / (10 + t)) : decay;
  for (size_t i = 0; i < current.size(); ++i) {
    Tensor& avg = tensors_[i].second;
    ScaleInPlace(avg, d);
    Axpy(1.0 - d, current[i].second, avg);
  }
  ++updates_;
}

void WeightAverage::Load(const std::vector<std::pair<std::string, Tensor>>& named, int64_t updates,
                         const std::string& where) {
  CopyNamedTensors(named, tensors_, where);
  updates_ = updates;
}

void WeightAverage::Swap(Model& model) {
  auto current = model.StateTensors();
  for (size_t i = 0; i < current.size(); ++i) {
    Tensor& avg = tensors_[i].second;
    Tensor held = current[i].second.Clone();
    current[i].second.CopyFrom(avg);
    avg.CopyFrom(held);
  }
}

}  // namespace cnnflow
