#include "ops/train/optimizer.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "ops/error.h"

namespace cnnflow {
namespace {

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

namespace {

// "conv1.weight (conv2d), bn1.weight (batchnorm), ...": the first few of `params`.
std::string SomeNames(const std::vector<NamedParameter>& params) {
  std::string names;
  for (size_t i = 0; i < params.size() && i < 6; ++i)
    names += StrCat(i ? ", " : "", params[i].name, " (", params[i].layer_type, ")");
  return names + (params.size() > 6 ? ", ..." : "");
}

}  // namespace

std::vector<std::string> CheckParamGroups(const std::vector<ParamGroup>& groups,
                                          const std::vector<NamedParameter>& params) {
  std::vector<std::string> notes;
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
    std::vector<NamedParameter> picked;
    for (const NamedParameter& p : params)
      if (g.Picks(p)) picked.push_back(p);
    if (picked.empty()) {
      throw ConfigError(StrCat(g.where, " picks no tensor; the model's are ", SomeNames(params)));
    }
    const bool all_frozen = std::all_of(picked.begin(), picked.end(), [](const NamedParameter& p) {
      return p.param != nullptr && !p.param->trainable;
    });
    if (all_frozen) {
      notes.push_back(StrCat(g.where, " picks only frozen tensors (", SomeNames(picked),
                             "): they do not train, so the group changes nothing"));
    }
  }
  return notes;
}

void CheckFreezeGlobs(const std::vector<std::string>& globs,
                      const std::vector<NamedParameter>& params) {
  if (!params.empty() && std::none_of(params.begin(), params.end(), [](const NamedParameter& p) {
        return p.param == nullptr || p.param->trainable;
      })) {
    throw ConfigError(
        "every tensor of the model is frozen (train.freeze, trainable: false): nothing would "
        "train");
  }
  for (const std::string& g : globs) {
    const bool names = std::any_of(params.begin(), params.end(), [&g](const NamedParameter& p) {
      return fnmatch(g.c_str(), p.name.c_str(), 0) == 0;
    });
    if (!names) {
      throw ConfigError(StrCat("train.freeze: '", g,
                               "' names no tensor of the model; the model's are ",
                               SomeNames(params)));
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

void Optimizer::Launch() {
  for (const auto& [key, update] : gpu_updates_)
    if (!update.slots.empty()) LaunchGpu(update);
}

Optimizer::GpuUpdates& Optimizer::ClearGpuUpdates() {
  for (auto& [key, update] : gpu_updates_) update.slots.clear();
  return gpu_updates_;
}

Optimizer::GpuUpdate& Optimizer::GpuUpdateOf(Device device, int group) {
  GpuUpdate& u = gpu_updates_[{device.index, group}];
  if (!u.scalars.defined()) {
    u.scalars = Tensor::Empty(Shape({static_cast<int64_t>(kFusedStepScalarBytes / sizeof(float))}),
                              DType::kF32, device);
  }
  return u;
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

}  // namespace cnnflow
