// Batch normalisation ("batchnorm"), as torch.nn.BatchNorm1d/2d: per channel
// c, y = (x - mean_c) / sqrt(var_c + eps) * weight_c + bias_c.
//
// Samples are [C, H, W] (BatchNorm2d), [C, L] or [C] (BatchNorm1d): the
// statistics of channel c are taken over the batch and every spatial
// position. In training the batch statistics are used (biased variance)
// and the running statistics updated with the unbiased variance:
//   running = (1 - momentum) * running + momentum * batch_stat;
// in evaluation the running statistics are used.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// x: [N, C, ...] -> y: [N, C, ...] (same shape).
// Parameters (affine: true): weight [C] (1), bias [C] (0).
// Buffers: running_mean [C] (0), running_var [C] (1).
class BatchNormLayer : public Layer {
 public:
  BatchNormLayer(const std::string& name, const Args& args);

  const char* type() const override { return "batchnorm"; }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  void ResetParameters(Rng& rng) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  // Training: the full batch-norm backward (through the batch statistics);
  // evaluation: the affine map with the running statistics.
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  int64_t ForwardFlops(int64_t n) const override { return 2 * n * channels_ * spatial_; }

  int64_t channels() const { return channels_; }

 private:
  void InitState();  // weight 1, bias 0, running_mean 0, running_var 1

  double momentum_;
  double eps_;
  bool affine_;
  int64_t channels_ = 0;
  int64_t spatial_ = 1;  // product of the dims after C (1 for [C])
  // Per-forward state: which statistics were used, per channel.
  bool last_training_ = false;
  std::vector<double> mean_;
  std::vector<double> inv_std_;
};

}  // namespace cnnflow
