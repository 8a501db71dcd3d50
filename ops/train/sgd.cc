#include "ops/train/sgd.h"

#include <cmath>
#include <map>
#include <memory>
#include <utility>

#include "ops/cpu/optimizer_kernels.h"
#include "ops/device_ops.h"
#include "ops/error.h"
#include "ops/train/param_update.h"

namespace cnnflow {

Sgd::Sgd(std::vector<NamedParameter> params, SgdOptions options)
    : Optimizer(std::move(params)), options_(options) {
  CheckNonNegative("sgd", "momentum", options_.momentum);
  CheckNonNegative("sgd", "weight_decay", options_.weight_decay);
  if (!std::isfinite(options_.dampening)) {
    throw ConfigError(StrCat("sgd: dampening must be finite, got ", options_.dampening));
  }
  if (options_.nesterov && (options_.momentum <= 0 || options_.dampening != 0)) {
    throw ConfigError(StrCat("sgd: nesterov needs momentum > 0 and dampening 0 (got momentum ",
                             options_.momentum, ", dampening ", options_.dampening, ")"));
  }
}

std::vector<std::string> Sgd::StateNames() const { return {"momentum_buffer"}; }

void Sgd::Prepare(double base_lr) {
  CountStep();
  GpuUpdates& gpu = ClearGpuUpdates();
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& param = *params_[i].param;
    const double lr = base_lr * lr_scale(i);
    const double wd = weight_decay(i, options_.weight_decay);
    if (UpdatedOnGpu(param)) {
      const Device dev = param.value.device();
      bool first = false;
      if (options_.momentum != 0 && state_[i].empty()) {
        state_[i].push_back(Tensor::Zeros(param.value.shape(), param.value.dtype(), dev));
        first = true;
      }
      MoveState(state_[i], dev);
      GpuUpdateOf(dev, group(i)).slots.push_back(Slot(param, state_[i], first));
      continue;
    }
    MoveState(state_[i], Device::Cpu());
    HostParam h = ToHost(param);
    bool first = false;
    if (options_.momentum != 0 && state_[i].empty()) {
      state_[i].push_back(Tensor::Empty(h.value.shape(), h.value.dtype()));
      first = true;
    }
    DispatchFloat(h.value.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      T* buf = state_[i].empty() ? nullptr : state_[i][0].data<T>();
      const cpu::SgdScalars s{wd, options_.momentum, options_.dampening, options_.nesterov};
      cpu::SgdUpdate<T>(h.value.data<T>(), h.grad.data<T>(), buf, first, h.value.numel(), s, lr);
    });
    WriteBack(param, h);
  }
  for (auto& [key, update] : gpu) {  // a group's parameters share their values
    if (update.slots.empty()) continue;
    const size_t i = GroupMember(key.second);
    UploadSgdScalars(update.scalars, base_lr * lr_scale(i), options_.momentum, options_.dampening,
                     options_.nesterov, weight_decay(i, options_.weight_decay));
  }
}

void Sgd::LaunchGpu(const GpuUpdate& update) const {
  LaunchFusedSgdStep(update.slots, update.scalars);
}

CNNFLOW_REGISTER_OPTIMIZER(
    sgd,
    Schema("Stochastic gradient descent with optional momentum (torch.optim.SGD).")
        .Required("lr", ParamType::kFloat, "base learning rate (the schedule scales it each step)")
        .Optional("momentum", ParamType::kFloat, 0.0, "momentum factor (0: none)")
        .Optional("dampening", ParamType::kFloat, 0.0, "dampening of the momentum")
        .Optional("nesterov", ParamType::kBool, false,
                  "Nesterov momentum (needs momentum > 0 and dampening 0)")
        .Optional("weight_decay", ParamType::kFloat, 0.0,
                  "L2 penalty, added to the gradient as weight_decay * param"),
    [](const Args& a, std::vector<NamedParameter> params) -> std::unique_ptr<Optimizer> {
      SgdOptions o;
      o.momentum = a.Float("momentum");
      o.dampening = a.Float("dampening");
      o.nesterov = a.Bool("nesterov");
      o.weight_decay = a.Float("weight_decay");
      return std::make_unique<Sgd>(std::move(params), o);
    });

}  // namespace cnnflow
