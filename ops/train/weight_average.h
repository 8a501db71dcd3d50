// An exponential moving average of a model's weights (Polyak averaging, as
// timm's ModelEmaV2 and Keras's `use_ema` keep it): after each optimizer
// step, for every parameter and buffer (BN running statistics too),
//   average = d * average + (1 - d) * current,
// starting from the weights it was made from; d = decay, or with warmup
// min(decay, (1 + t) / (10 + t)) at the t-th update (timm's, TF's
// num_updates), so a short run's average is not held near the initial
// weights. On the model's device; an
// update is two passes over the weights and allocates nothing.
//
// On a schedule (WeightAverageSchedule): every k-th optimizer step from a
// start step, the decay ramped up as (step / total)^p, as the CIFAR speed
// runs' lookahead (Zhang et al. 2019) keeps it: there each update is also
// copied back into the weights (CopyTo).
//
// Its tensors are named "ema.<layer>.<tensor>" (kEmaPrefix, ops/model.h) in checkpoints,
// so a resumed run continues the average bitwise, and in model.safetensors
// beside the weights themselves.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops/model.h"

namespace cnnflow {

// When an update is due and its decay. Steps count optimizer steps done.
struct WeightAverageSchedule {
  int64_t every = 1;       // update after every k-th step
  int64_t start_step = 0;  // no update before this many steps
  double ramp_power = 0;   // > 0: decay * (steps / total_steps)^ramp_power
  int64_t total_steps = 0;
};

class WeightAverage {
 public:
  // decay in [0, 1); the average starts as a copy of model's weights.
  // Throws ConfigError for a bad decay or schedule.
  WeightAverage(Model& model, double decay, bool warmup = false,
                WeightAverageSchedule schedule = {});

  double decay() const { return decay_; }
  int64_t updates() const { return updates_; }
  // An update with the plain decay (warmup applied).
  void Update(Model& model);
  // After optimizer step `steps` (steps done): updates when the schedule
  // says so, with its decay; returns whether it did.
  bool UpdateAfter(Model& model, int64_t steps);
  // The model's weights become the average (lookahead's copy back).
  void CopyTo(Model& model) const;
  // The same average (settings, tensors, count) for another instance of
  // the model, on its device: another replica's lookahead.
  std::unique_ptr<WeightAverage> CopyFor(Model& model) const;

  // ("ema.conv1.weight", tensor) pairs, in Model::StateTensors order.
  const std::vector<std::pair<std::string, Tensor>>& tensors() const { return tensors_; }
  // Takes the average from `named` (as tensors() names them); throws naming
  // `where` and the tensor when one is missing or has another shape.
  void Load(const std::vector<std::pair<std::string, Tensor>>& named, int64_t updates,
            const std::string& where);
  // Exchanges the model's weights with the average (twice: back again), so
  // an evaluation can run on the averaged weights.
  void Swap(Model& model);

 private:
  void UpdateWith(Model& model, double decay);

  double decay_;
  bool warmup_;
  WeightAverageSchedule schedule_;
  int64_t updates_ = 0;
  std::vector<std::pair<std::string, Tensor>> tensors_;
};

}  // namespace cnnflow
