#include "ops/train/adam.h"

#include <cmath>
#include <map>
#include <memory>
#include <utility>

#include "ops/cpu/optimizer_kernels.h"
#include "ops/device_ops.h"
#include "ops/error.h"
#include "ops/train/param_update.h"

namespace cnnflow {
namespace {

Schema AdamSchema(const char* doc, double weight_decay, const char* wd_doc) {
  return Schema(doc)
      .Required("lr", ParamType::kFloat, "base learning rate (the schedule scales it each step)")
      .Optional("beta1", ParamType::kFloat, 0.9, "decay of the running mean of gradients")
      .Optional("beta2", ParamType::kFloat, 0.999, "decay of the running mean of squared gradients")
      .Optional("eps", ParamType::kFloat, 1e-8, "added to the denominator for stability")
      .Optional("weight_decay", ParamType::kFloat, weight_decay, wd_doc);
}

AdamOptions AdamOptionsOf(const Args& a) {
  AdamOptions o;
  o.beta1 = a.Float("beta1");
  o.beta2 = a.Float("beta2");
  o.eps = a.Float("eps");
  o.weight_decay = a.Float("weight_decay");
  return o;
}

}  // namespace

Adam::Adam(std::vector<NamedParameter> params, AdamOptions options, bool decoupled)
    : Optimizer(std::move(params)), options_(options), decoupled_(decoupled) {
  const char* name = decoupled_ ? "adamw" : "adam";
  if (!(options_.beta1 >= 0 && options_.beta1 < 1)) {
    throw ConfigError(StrCat(name, ": beta1 must be in [0, 1), got ", options_.beta1));
  }
  if (!(options_.beta2 >= 0 && options_.beta2 < 1)) {
    throw ConfigError(StrCat(name, ": beta2 must be in [0, 1), got ", options_.beta2));
  }
  CheckNonNegative(name, "eps", options_.eps);
  CheckNonNegative(name, "weight_decay", options_.weight_decay);
}

std::vector<std::string> Adam::StateNames() const { return {"exp_avg", "exp_avg_sq"}; }

void Adam::Prepare(double base_lr) {
  CountStep();
  GpuUpdates& gpu = ClearGpuUpdates();
  const double t = static_cast<double>(step_count_);
  // The step's scalars; each parameter's group sets its lr and decay ones.
  cpu::AdamScalars s;
  s.beta1 = options_.beta1;
  s.beta2 = options_.beta2;
  s.eps = options_.eps;
  s.bc2_sqrt = std::sqrt(1 - std::pow(options_.beta2, t));
  const double bc1 = 1 - std::pow(options_.beta1, t);
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& param = *params_[i].param;
    const double lr = base_lr * lr_scale(i);
    const double wd = weight_decay(i, options_.weight_decay);
    s.decay_factor = decoupled_ ? 1 - lr * wd : 1;
    s.l2 = decoupled_ ? 0 : wd;
    s.step_size = lr / bc1;
    if (UpdatedOnGpu(param)) {
      const Device dev = param.value.device();
      if (state_[i].empty()) {
        state_[i].push_back(Tensor::Zeros(param.value.shape(), param.value.dtype(), dev));
        state_[i].push_back(Tensor::Zeros(param.value.shape(), param.value.dtype(), dev));
      }
      MoveState(state_[i], dev);
      GpuUpdateOf(dev, group(i)).slots.push_back(Slot(param, state_[i], false));
      continue;
    }
    MoveState(state_[i], Device::Cpu());
    HostParam h = ToHost(param);
    if (state_[i].empty()) {
      state_[i].push_back(Tensor::Zeros(h.value.shape(), h.value.dtype()));
      state_[i].push_back(Tensor::Zeros(h.value.shape(), h.value.dtype()));
    }
    DispatchFloat(h.value.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      cpu::AdamUpdate<T>(h.value.data<T>(), h.grad.data<T>(), state_[i][0].data<T>(),
                         state_[i][1].data<T>(), h.value.numel(), s);
    });
    WriteBack(param, h);
  }
  for (auto& [key, update] : gpu) {  // a group's parameters share their values
    if (update.slots.empty()) continue;
    const size_t i = GroupMember(key.second);
    UploadAdamScalars(update.scalars, base_lr * lr_scale(i), options_.beta1, options_.beta2,
                      options_.eps, weight_decay(i, options_.weight_decay), decoupled_,
                      step_count_);
  }
}

void Adam::LaunchGpu(const GpuUpdate& update) const {
  LaunchFusedAdamStep(update.slots, update.scalars);
}

CNNFLOW_REGISTER_OPTIMIZER(
    adam,
    AdamSchema("Adam (torch.optim.Adam): adaptive moments with bias correction.", 0.0,
               "L2 penalty, added to the gradient as weight_decay * param"),
    [](const Args& a, std::vector<NamedParameter> params) -> std::unique_ptr<Optimizer> {
      return std::make_unique<Adam>(std::move(params), AdamOptionsOf(a), /*decoupled=*/false);
    });

CNNFLOW_REGISTER_OPTIMIZER(
    adamw,
    AdamSchema("AdamW (torch.optim.AdamW): Adam with decoupled weight decay.", 0.01,
               "decoupled weight decay: param *= 1 - lr * weight_decay each step"),
    [](const Args& a, std::vector<NamedParameter> params) -> std::unique_ptr<Optimizer> {
      return std::make_unique<AdamW>(std::move(params), AdamOptionsOf(a));
    });

}  // namespace cnnflow
