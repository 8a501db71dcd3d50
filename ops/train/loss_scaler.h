// Dynamic loss scaling for mixed-precision training (as PyTorch's
// torch.cuda.amp.GradScaler): the loss is multiplied by scale() before
// backward so small half-precision gradients do not flush to zero; the
// gradients are divided by it before the optimizer step. A step whose
// gradients hold an inf or NaN is skipped and the scale lowered; after
// `growth_interval` good steps in a row the scale is raised. The logic is
// device-independent: a GPU step passes its found-inf flag to Update.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/tensor.h"

namespace cnnflow {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1.0;  // never lower (a model that overflows at 1 is broken)
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});

  double scale() const { return scale_; }
  // Multiplies every gradient by 1 / scale() in place and reports whether
  // any element is inf or NaN (host f32/f64 tensors).
  bool Unscale(const std::vector<Tensor*>& grads) const;
  // After a step's gradients were checked: returns whether the optimizer
  // step should be taken (false: skip it), and moves the scale.
  bool Update(bool found_inf);

  int64_t skipped_steps() const { return skipped_; }
  // For checkpoints: the scale and the good steps counted towards growth.
  int64_t growth_tracker() const { return tracker_; }
  void Restore(double scale, int64_t growth_tracker);

 private:
  LossScalerOptions opt_;
  double scale_;
  int64_t tracker_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace cnnflow
