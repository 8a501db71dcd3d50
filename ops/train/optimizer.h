// Optimizers: the base of SGD (sgd.h), Adam and AdamW (adam.h), which keep
// exactly the update rules of torch.optim (same state, same order of
// operations), so a run can be compared step by step with PyTorch and its
// state saved in a checkpoint under PyTorch-like names
// ("fc1.weight.momentum_buffer", "fc1.bias.exp_avg"); their registry, and
// parameter groups.
//
// An optimizer is bound to a list of named parameters; Step(lr) applies
// Parameter::grad to Parameter::value (f32 or f64, each parameter in its own
// dtype). It never zeroes the gradients: the caller does (Model::ZeroGrad),
// which lets gradients accumulate over micro-batches. The learning rate
// comes from the caller each step (the LR schedule), so `lr` in the schema
// is the BASE learning rate the schedule starts from.
//
// How to add an optimizer type: ops/train/<name>.{h,cc}, a class deriving
// from Optimizer, and CNNFLOW_REGISTER_OPTIMIZER(name, schema, factory) in
// its .cc (as layers, stages and sources register); its host loops in
// ops/cpu/ (as optimizer_kernels.h), its GPU ones behind ops/device_ops.h,
// reached through ops/train/param_update.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ops/device_ops.h"
#include "ops/model.h"
#include "ops/registry.h"
#include "ops/schema.h"
#include "ops/tensor.h"

namespace cnnflow {

using NamedParameter = Model::NamedParameter;

// A parameter group, as torch.optim's param_groups: the tensors it picks
// train with their own learning-rate scale and weight decay (no decay on
// norm and bias tensors, as torchvision's recipes; a higher rate for BN
// biases, as the CIFAR speed runs). A tensor belongs to the first group
// that picks it; a tensor no group picks keeps the optimizer's values.
struct ParamGroup {
  // Globs (fnmatch) over "<layer>.<tensor>" names; empty: any name.
  std::vector<std::string> params;
  // Layer types ("batchnorm"); empty: any layer.
  std::vector<std::string> layer_types;
  double lr_scale = 1;                 // the schedule's lr times this
  std::optional<double> weight_decay;  // unset: the optimizer's
  // > 0: the tensors train in the first until_step optimizer steps only,
  // then hold (the trainer sets it from the config's until_epoch).
  double until_epoch = 0;
  int64_t until_step = 0;
  std::string where;  // names the group in errors
  bool Picks(const NamedParameter& p) const;
};

// What an optimizer is made of: a registered type, its arguments, groups.
struct OptimizerSpec {
  std::string type;  // "sgd", ...
  Args args;
  std::vector<ParamGroup> groups = {};
};

// Throws ConfigError naming a group that picks none of `params` (a typo
// would otherwise silently train with the default values), or whose values
// are out of range. A group whose tensors are all frozen is no error (a
// frozen backbone may keep its group): it gets a line in the returned
// notes, which say so.
std::vector<std::string> CheckParamGroups(const std::vector<ParamGroup>& groups,
                                          const std::vector<NamedParameter>& params);

// train.freeze: throws ConfigError naming a glob that matches no tensor of
// `params` (a typo would otherwise train what was meant to be frozen), or
// when every tensor is frozen.
void CheckFreezeGlobs(const std::vector<std::string>& globs,
                      const std::vector<NamedParameter>& params);

class Optimizer {
 public:
  explicit Optimizer(std::vector<NamedParameter> params);
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual const char* type() const = 0;

  // One update of every bound parameter with learning rate `lr` (times
  // the parameter's group's lr_scale); counts the step first (Adam's bias correction uses the count
  // after it). f32 parameters on a GPU are updated there by fused multi-tensor kernels
  // (ops/device_ops.h), their state kept on the GPU.
  void Step(double lr) {
    Prepare(lr);
    Launch();
  }
  // Step in its two parts, for a step captured as a CUDA graph
  // (ops/parallel/step_graph.h): Prepare does the host's part (counts the
  // step, makes state, updates the parameters the fused kernels do not
  // take) and writes this step's scalars to GPU memory; Launch issues the
  // fused GPU kernels, which read them there, so that a captured Launch
  // replays with each step's values. One Launch after each Prepare.
  virtual void Prepare(double lr) = 0;
  void Launch();

  // The optimizer's state for a checkpoint, named "<param>.<state>"; state
  // is created at the first Step (as PyTorch does), so this is empty before
  // it. The tensors share storage with the optimizer (contiguous, on the
  // parameters' device).
  std::vector<std::pair<std::string, Tensor>> StateTensors() const;
  // Restores state from a checkpoint's tensors: for each parameter, either
  // all of its state tensors are present (copied in; shape checked, dtype
  // converted to the parameter's) or none (it stays uninitialised). Other
  // names are ignored. Returns how many tensors were loaded. The step count
  // is not a tensor: restore it with set_step_count.
  int LoadStateTensors(const std::vector<std::pair<std::string, Tensor>>& tensors);

  // Binds each parameter to the first group that picks it (see ParamGroup).
  void AssignGroups(const std::vector<ParamGroup>& groups);
  // Parameter i's learning-rate scale, and its weight decay (`base`: the
  // optimizer's, unless its group sets one).
  // (0 past its group's until_step: lr_scale counts steps done, this one
  // included).
  double lr_scale(size_t i) const {
    return until_step_[i] > 0 && step_count_ > until_step_[i] ? 0.0 : lr_scale_[i];
  }
  double weight_decay(size_t i, double base) const {
    return std::isnan(weight_decay_[i]) ? base : weight_decay_[i];
  }
  // Parameter i's group: -1 for none; indices into AssignGroups's list.
  int group(size_t i) const { return group_[i]; }

  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t n) {
    step_count_ = n;
    UpdateHeld();
  }
  const std::vector<NamedParameter>& params() const { return params_; }

 protected:
  // Counts a step (at the start of Step).
  void CountStep() {
    ++step_count_;
    UpdateHeld();
  }
  // A parameter of group g (-1: of none): the group's values are its.
  size_t GroupMember(int g) const;
  // The names of one parameter's state tensors ("momentum_buffer", ...).
  virtual std::vector<std::string> StateNames() const = 0;
  // Prepare's GPU part, by (GPU index, group): this step's slots, and the
  // GPU memory of their scalars (kept: a captured launch reads them where
  // each step writes them).
  struct GpuUpdate {
    std::vector<ParamSlot> slots;
    Tensor scalars;
  };
  using GpuUpdates = std::map<std::pair<int, int>, GpuUpdate>;
  // The updates with their slots emptied, for Prepare to fill.
  GpuUpdates& ClearGpuUpdates();
  // (device, group)'s, its scalars' memory made on first use.
  GpuUpdate& GpuUpdateOf(Device device, int group);
  // The fused kernels of one (GPU, group), reading its scalars.
  virtual void LaunchGpu(const GpuUpdate& update) const = 0;
  // state_[i]: parameter i's state tensors in StateNames() order; empty
  // until created.
  std::vector<std::vector<Tensor>> state_;
  std::vector<NamedParameter> params_;
  int64_t step_count_ = 0;

 private:
  // Parameter::held of each bound parameter: whether the next step's
  // lr_scale is 0 (its group's until_step passed), so no backward needs
  // its gradient.
  void UpdateHeld();
  GpuUpdates gpu_updates_;
  std::vector<int> group_;
  std::vector<double> lr_scale_;
  std::vector<int64_t> until_step_;   // 0: always
  std::vector<double> weight_decay_;  // NaN: the optimizer's
};

// Registered optimizer types, by name.
// `args` has the schema's defaults filled in and was checked against it.
using OptimizerFactory =
    std::function<std::unique_ptr<Optimizer>(const Args& args, std::vector<NamedParameter> params)>;

struct OptimizerType {
  static constexpr const char* kKind = "optimizer type";
  Schema schema;
  OptimizerFactory create;
};
using OptimizerRegistry = Registry<OptimizerType>;

#define CNNFLOW_REGISTER_OPTIMIZER(type_name, schema_expr, factory) \
  static ::cnnflow::RegisterIn<::cnnflow::OptimizerType>            \
      cnnflow_optimizer_registration_##type_name(#type_name, {schema_expr, factory})

// The registered optimizer types (adam, adamw, sgd).
std::vector<std::string> OptimizerTypes();
// The YAML schema of an optimizer type; throws ConfigError naming the known
// types (and the closest one) for an unknown type.
const Schema& OptimizerSchema(const std::string& type);
// An optimizer of `type` over `params`, configured by `args` (checked
// against OptimizerSchema(type); missing defaults are filled in).
std::unique_ptr<Optimizer> MakeOptimizer(const std::string& type, const Args& args,
                                         std::vector<NamedParameter> params);
// The same with the spec's groups assigned.
std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerSpec& spec,
                                         std::vector<NamedParameter> params);

}  // namespace cnnflow
