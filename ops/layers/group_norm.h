// Group normalisation ("groupnorm"), as torch.nn.GroupNorm: the C channels
// of a sample are cut into G groups of C/G; each group is normalised by the
// mean and (biased) variance of its C/G x P values, then scaled and shifted
// per channel:  y[c, p] = (x[c, p] - mean_g) / sqrt(var_g + eps) * weight[c] + bias[c].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/layers/channel_norm.h"

namespace cnnflow {

// x: [N, C, ...] -> y: [N, C, ...] (same shape); C divisible by groups.
// Parameters (affine: true): weight [C] (1), bias [C] (0).
class GroupNormLayer : public ChannelNormLayer {
 public:
  GroupNormLayer(const std::string& name, const Args& args);

  const char* type() const override { return "groupnorm"; }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  int64_t ForwardFlops(int64_t n) const override { return 6 * n * channels_ * positions_; }

  int64_t groups() const { return groups_; }

 protected:  // (mean_ and rstd_ hold [N * G] statistics)
  int64_t groups_;

 private:
  Tensor partial_;  // backward's per-(sample, channel) sums of dy x and dy, [2, N, C]
};

}  // namespace cnnflow
