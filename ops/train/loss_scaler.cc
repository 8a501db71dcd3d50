#include "ops/train/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace cnnflow {

LossScaler::LossScaler(LossScalerOptions options) : opt_(options), scale_(options.init_scale) {
  CNNFLOW_ENFORCE(opt_.init_scale > 0 && opt_.growth_factor > 1 && opt_.backoff_factor > 0 &&
                      opt_.backoff_factor < 1 && opt_.growth_interval > 0,
                  "loss scaler: need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, "
                  "growth_interval > 0");
}

bool LossScaler::Unscale(const std::vector<Tensor*>& grads) const {
  bool found = false;
  for (Tensor* g : grads) {
    DispatchFloat(g->dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      T* d = g->data<T>();
      const T inv = static_cast<T>(1.0 / scale_);
      bool bad = false;
      for (int64_t i = 0; i < g->numel(); ++i) {
        d[i] *= inv;
        bad |= !std::isfinite(d[i]);
      }
      found |= bad;
    });
  }
  return found;
}

bool LossScaler::Update(bool found_inf) {
  if (found_inf) {
    scale_ = std::max(opt_.min_scale, scale_ * opt_.backoff_factor);
    tracker_ = 0;
    ++skipped_;
    return false;
  }
  if (++tracker_ == opt_.growth_interval) {
    scale_ *= opt_.growth_factor;
    tracker_ = 0;
  }
  return true;
}

void LossScaler::Restore(double scale, int64_t growth_tracker) {
  CNNFLOW_ENFORCE(scale > 0 && growth_tracker >= 0, "bad loss scaler state ", scale, ", ",
                  growth_tracker);
  scale_ = scale;
  tracker_ = growth_tracker;
}

}  // namespace cnnflow
