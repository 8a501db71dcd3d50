// torch.optim.Adam and AdamW as Optimizers (ops/train/optimizer.h),
// registered as `adam` and `adamw`.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ops/train/optimizer.h"

namespace cnnflow {

// torch.optim.Adam (L2 weight decay added to the gradient) and
// torch.optim.AdamW (decoupled: p = p * (1 - lr * wd) first). At step t:
//   m = m + (1 - b1) * (g - m);  v = b2 * v + (1 - b2) * g * g
//   p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
struct AdamOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // AdamW's default is 0.01 (see MakeOptimizer)
};

class Adam : public Optimizer {
 public:
  // decoupled = true is AdamW. Throws ConfigError for betas outside [0, 1),
  // a negative eps or weight decay.
  Adam(std::vector<NamedParameter> params, AdamOptions options, bool decoupled = false);
  const char* type() const override { return decoupled_ ? "adamw" : "adam"; }
  void Prepare(double lr) override;
  const AdamOptions& options() const { return options_; }

 protected:
  std::vector<std::string> StateNames() const override;
  void LaunchGpu(const GpuUpdate& update) const override;

 private:
  AdamOptions options_;
  bool decoupled_;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<NamedParameter> params, AdamOptions options)
      : Adam(std::move(params), options, /*decoupled=*/true) {}
};

}  // namespace cnnflow
