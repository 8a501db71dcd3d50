#include "ops/train/weight_average.h"

#include <algorithm>

#include "ops/device_ops.h"

namespace cnnflow {

WeightAverage::WeightAverage(Model& model, double decay, bool warmup)
    : decay_(decay), warmup_(warmup) {
  if (!(decay >= 0 && decay < 1)) {
    throw ConfigError(StrCat("ema: decay must be in [0, 1), got ", decay));
  }
  for (auto& [name, t] : model.StateTensors()) tensors_.emplace_back(kEmaPrefix + name, t.Clone());
}

void WeightAverage::Update(Model& model) {
  const auto current = model.StateTensors();
  CNNFLOW_ENFORCE(current.size() == tensors_.size(), "ema: the model changed shape");
  const double t = static_cast<double>(updates_);
  const double d = warmup_ ? std::min(decay_, (1 + t) / (10 + t)) : decay_;
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
