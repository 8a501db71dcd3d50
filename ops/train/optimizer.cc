#include "ops/train/optimizer.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "ops/cpu/optimizer_kernels.h"
#include "ops/device_ops.h"
#include "ops/error.h"

namespace cnnflow {
namespace {

// A parameter's value and gradient as host tensors. On the host they are
// the parameter's own tensors; a GPU parameter is copied here and back.
struct HostParam {
  Tensor value;
  Tensor grad;
  bool copied = false;
};

HostParam ToHost(const Parameter& p) {
  if (p.value.device().is_cpu() && p.grad.device().is_cpu()) return {p.value, p.grad, false};
  return {p.value.To(Device::Cpu()), p.grad.To(Device::Cpu()), true};
}

void WriteBack(Parameter& p, const HostParam& h) {
  if (h.copied) p.value.CopyFrom(h.value);
}

// An f32 parameter whose value and gradient are on one GPU is updated there
// by the fused kernels (ops/cuda/kernels.h); any other (f64 on a GPU, mixed
// devices) goes through host copies.
bool UpdatedOnGpu(const Parameter& p) {
  return p.value.device().is_cuda() && p.grad.device() == p.value.device() &&
         p.value.dtype() == DType::kF32;
}

// State lives where the update runs; state restored from a checkpoint is
// on the host until the first GPU step moves it.
void MoveState(std::vector<Tensor>& state, Device device) {
  for (Tensor& t : state) {
    if (t.device() != device) t = t.To(device);
  }
}

ParamSlot Slot(Parameter& p, std::vector<Tensor>& state, bool first) {
  ParamSlot slot;
  slot.value = p.value.data<float>();
  slot.grad = p.grad.data<float>();
  slot.state0 = state.size() > 0 ? state[0].data<float>() : nullptr;
  slot.state1 = state.size() > 1 ? state[1].data<float>() : nullptr;
  slot.numel = p.value.numel();
  slot.first = first;
  return slot;
}

void CheckNonNegative(const char* optimizer, const char* name, double v) {
  if (!(v >= 0)) {
    throw ConfigError(StrCat(optimizer, ": ", name, " must be >= 0, got ", v));
  }
}

// Frozen parameters (Parameter::trainable false) are not bound: they get no
// update, no weight decay and no state, as PyTorch's requires_grad=False.
std::vector<NamedParameter> Trainable(std::vector<NamedParameter> params) {
  std::vector<NamedParameter> out;
  for (auto& p : params)
    if (p.param == nullptr || p.param->trainable) out.push_back(std::move(p));
  return out;
}
}  // namespace

Optimizer::Optimizer(std::vector<NamedParameter> params) : params_(Trainable(std::move(params))) {
  state_.resize(params_.size());
  AssignGroups({});
  for (const auto& np : params_) {
    CNNFLOW_ENFORCE(np.param != nullptr, "optimizer: parameter '", np.name, "' is null");
    const Parameter& p = *np.param;
    CNNFLOW_ENFORCE(p.value.defined() && p.grad.defined(), "optimizer: parameter '", np.name,
                    "' has no value or no gradient");
    CNNFLOW_ENFORCE(p.value.shape() == p.grad.shape() && p.value.dtype() == p.grad.dtype(),
                    "optimizer: parameter '", np.name, "' is ", p.value.shape(), " ",
                    DTypeName(p.value.dtype()), " but its gradient is ", p.grad.shape(), " ",
                    DTypeName(p.grad.dtype()));
    CNNFLOW_ENFORCE(p.value.is_contiguous() && p.grad.is_contiguous(), "optimizer: parameter '",
                    np.name, "' is not contiguous");
    CNNFLOW_ENFORCE(p.value.dtype() == DType::kF32 || p.value.dtype() == DType::kF64,
                    "optimizer: parameter '", np.name, "' is ", DTypeName(p.value.dtype()),
                    "; only f32 and f64 parameters are supported");
  }
}

Optimizer::~Optimizer() = default;

bool ParamGroup::Picks(const NamedParameter& p) const {
  const auto glob = [&p](const std::string& g) {
    return fnmatch(g.c_str(), p.name.c_str(), 0) == 0;
  };
  return (params.empty() || std::any_of(params.begin(), params.end(), glob)) &&
         (layer_types.empty() ||
          std::find(layer_types.begin(), layer_types.end(), p.layer_type) != layer_types.end());
}

void CheckParamGroups(const std::vector<ParamGroup>& groups,
                      const std::vector<NamedParameter>& params) {
  for (const ParamGroup& g : groups) {
    if (!(g.lr_scale >= 0 && std::isfinite(g.lr_scale))) {
      throw ConfigError(StrCat(g.where, ": lr_scale must be >= 0, got ", g.lr_scale));
    }
    if (!(g.until_epoch >= 0 && g.until_step >= 0)) {
      throw ConfigError(StrCat(g.where, ": until_epoch must be >= 0, got ", g.until_epoch));
    }
    if (g.weight_decay && !(*g.weight_decay >= 0 && std::isfinite(*g.weight_decay))) {
      throw ConfigError(StrCat(g.where, ": weight_decay must be >= 0, got ", *g.weight_decay));
    }
    const bool picks = std::any_of(params.begin(), params.end(), [&g](const NamedParameter& p) {
      return (p.param == nullptr || p.param->trainable) && g.Picks(p);
    });
    if (!picks) {
      std::string names;
      for (size_t i = 0; i < params.size() && i < 6; ++i)
        names += StrCat(i ? ", " : "", params[i].name, " (", params[i].layer_type, ")");
      throw ConfigError(StrCat(g.where, " picks no trainable tensor; the model's are ", names,
                               params.size() > 6 ? ", ..." : ""));
    }
  }
}

size_t Optimizer::GroupMember(int g) const {
  return static_cast<size_t>(std::find(group_.begin(), group_.end(), g) - group_.begin());
}

void Optimizer::AssignGroups(const std::vector<ParamGroup>& groups) {
  group_.assign(params_.size(), -1);
  lr_scale_.assign(params_.size(), 1.0);
  until_step_.assign(params_.size(), 0);
  weight_decay_.assign(params_.size(), std::numeric_limits<double>::quiet_NaN());
  for (size_t i = 0; i < params_.size(); ++i) {
    for (size_t g = 0; g < groups.size(); ++g) {
      if (!groups[g].Picks(params_[i])) continue;
      group_[i] = static_cast<int>(g);
      lr_scale_[i] = groups[g].lr_scale;
      until_step_[i] = groups[g].until_step;
      if (groups[g].weight_decay) weight_decay_[i] = *groups[g].weight_decay;
      break;
    }
  }
  UpdateHeld();
}

void Optimizer::UpdateHeld() {
  for (size_t i = 0; i < params_.size() && i < until_step_.size(); ++i) {
    if (params_[i].param != nullptr) {
      params_[i].param->held = until_step_[i] > 0 && step_count_ + 1 > until_step_[i];
    }
  }
}

std::vector<std::pair<std::string, Tensor>> Optimizer::StateTensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  const std::vector<std::string> names = StateNames();
  for (size_t i = 0; i < params_.size(); ++i)
    for (size_t j = 0; j < state_[i].size(); ++j)
      out.emplace_back(params_[i].name + "." + names[j], state_[i][j]);
  return out;
}

int Optimizer::LoadStateTensors(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : tensors) by_name[name] = &t;
  const std::vector<std::string> names = StateNames();
  int loaded = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = *params_[i].param;
    std::vector<const Tensor*> found;
    std::string missing;
    for (const auto& n : names) {
      auto it = by_name.find(params_[i].name + "." + n);
      if (it != by_name.end()) {
        found.push_back(it->second);
      } else {
        missing += (missing.empty() ? "" : ", ") + params_[i].name + "." + n;
      }
    }
    if (found.empty()) continue;
    if (found.size() != names.size()) {
      throw Error(
          StrCat(type(), " state of '", params_[i].name, "' is incomplete: missing ", missing));
    }
    std::vector<Tensor> state;
    for (size_t j = 0; j < found.size(); ++j) {
      const Tensor& src = *found[j];
      if (src.shape() != p.value.shape()) {
        throw Error(StrCat(type(), " state '", params_[i].name, ".", names[j], "' has shape ",
                           src.shape(), ", the parameter has ", p.value.shape()));
      }
      Tensor host = src.To(Device::Cpu());
      if (host.dtype() != p.value.dtype()) {
        if (host.dtype() != DType::kF32 && host.dtype() != DType::kF64) {
          throw Error(StrCat(type(), " state '", params_[i].name, ".", names[j], "' is ",
                             DTypeName(host.dtype()), "; expected f32 or f64"));
        }
        host = host.Cast(p.value.dtype());
      }
      state.push_back(std::move(host));
    }
    state_[i] = std::move(state);
    loaded += static_cast<int>(names.size());
  }
  return loaded;
}

// ---------------------------------------------------------------- SGD

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

void Sgd::Step(double base_lr) {
  CountStep();
  std::map<std::pair<int, int>, std::vector<ParamSlot>> gpu;  // by GPU index, group
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
      gpu[{dev.index, group(i)}].push_back(Slot(param, state_[i], first));
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
  for (const auto& [key, slots] : gpu) {  // a group's parameters share their values
    const size_t i = GroupMember(key.second);
    FusedSgdStep(Device::Cuda(key.first), slots, base_lr * lr_scale(i), options_.momentum,
                 options_.dampening, options_.nesterov, weight_decay(i, options_.weight_decay));
  }
}

// ---------------------------------------------------------------- Adam, AdamW

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

void Adam::Step(double base_lr) {
  CountStep();
  const double t = static_cast<double>(step_count_);
  // The step's scalars; each parameter's group sets its lr and decay ones.
  cpu::AdamScalars s;
  s.beta1 = options_.beta1;
  s.beta2 = options_.beta2;
  s.eps = options_.eps;
  s.bc2_sqrt = std::sqrt(1 - std::pow(options_.beta2, t));
  const double bc1 = 1 - std::pow(options_.beta1, t);
  std::map<std::pair<int, int>, std::vector<ParamSlot>> gpu;  // by GPU index, group
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
      gpu[{dev.index, group(i)}].push_back(Slot(param, state_[i], false));
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
  for (const auto& [key, slots] : gpu) {  // a group's parameters share their values
    const size_t i = GroupMember(key.second);
    FusedAdamStep(Device::Cuda(key.first), slots, base_lr * lr_scale(i), options_.beta1,
                  options_.beta2, options_.eps, weight_decay(i, options_.weight_decay), decoupled_,
                  step_count_);
  }
}

// ---------------------------------------------------------------- registry

std::vector<std::string> OptimizerTypes() { return OptimizerRegistry::Get().Names(); }

const Schema& OptimizerSchema(const std::string& type) {
  return OptimizerRegistry::Get().Get(type).schema;
}

std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerSpec& spec,
                                         std::vector<NamedParameter> params) {
  std::unique_ptr<Optimizer> opt = MakeOptimizer(spec.type, spec.args, std::move(params));
  opt->AssignGroups(spec.groups);
  return opt;
}

std::unique_ptr<Optimizer> MakeOptimizer(const std::string& type, const Args& args,
                                         std::vector<NamedParameter> params) {
  const Schema& schema = OptimizerSchema(type);
  for (const auto& [name, value] : args.values()) {
    if (schema.Find(name) != nullptr) continue;
    std::string msg = StrCat("optimizer ", type, ": unknown parameter '", name, "'");
    const std::string close = ClosestMatch(name, schema.Names());
    if (!close.empty()) msg += StrCat(" (did you mean '", close, "'?)");
    throw ConfigError(msg);
  }
  Args a = args;
  a.FillDefaults(schema);
  return OptimizerRegistry::Get().Find(type)->create(a, std::move(params));
}

// ---------------------------------------------------------------- the types

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
