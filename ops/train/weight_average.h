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
// Its tensors are named "ema.<layer>.<tensor>" (kEmaPrefix, ops/model.h) in checkpoints,
// so a resumed run continues the average bitwise, and in model.safetensors
// beside the weights themselves.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/model.h"

namespace cnnflow {

class WeightAverage {
 public:
  // decay in [0, 1); the average starts as a copy of model's weights.
  WeightAverage(Model& model, double decay, bool warmup = false);

  double decay() const { return decay_; }
  int64_t updates() const { return updates_; }
  void Update(Model& model);

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
  double decay_;
  bool warmup_;
  int64_t updates_ = 0;
  std::vector<std::pair<std::string, Tensor>> tensors_;
};

}  // namespace cnnflow
