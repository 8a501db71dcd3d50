// torch.optim.SGD as an Optimizer (ops/train/optimizer.h), registered as `sgd`.
#pragma once

#include <string>
#include <vector>

#include "ops/train/optimizer.h"

namespace cnnflow {

// torch.optim.SGD: with weight decay wd, momentum mu, dampening d:
//   g = grad + wd * p
//   buf = g at the first step, else mu * buf + (1 - d) * g   (if mu != 0)
//   g = nesterov ? g + mu * buf : buf                        (if mu != 0)
//   p = p - lr * g
struct SgdOptions {
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
  double weight_decay = 0;
};

class Sgd : public Optimizer {
 public:
  // Throws ConfigError for a negative momentum / weight decay, or nesterov
  // without momentum or with dampening (as PyTorch does).
  Sgd(std::vector<NamedParameter> params, SgdOptions options);
  const char* type() const override { return "sgd"; }
  void Prepare(double lr) override;
  const SgdOptions& options() const { return options_; }

 protected:
  std::vector<std::string> StateNames() const override;
  void LaunchGpu(const GpuUpdate& update) const override;

 private:
  SgdOptions options_;
};

}  // namespace cnnflow
