// Layer normalisation over the channels ("layernorm"): at each position of
// a [C, H, W] or [C, L] sample, the C values are normalised by their own
// mean and (biased) variance, then scaled and shifted per channel:
//   y[c, p] = (x[c, p] - mean_p) / sqrt(var_p + eps) * weight[c] + bias[c]
// as ConvNeXt's LayerNorm2d (and its blocks' nn.LayerNorm on permuted NHWC
// activations). A [C] sample is plain nn.LayerNorm(C).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/layers/channel_norm.h"

namespace cnnflow {

// x: [N, C, ...] -> y: [N, C, ...] (same shape).
// Parameters (affine: true): weight [C] (1), bias [C] (0).
class LayerNormLayer : public ChannelNormLayer {
 public:
  LayerNormLayer(const std::string& name, const Args& args);

  const char* type() const override { return "layernorm"; }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  int64_t ForwardFlops(int64_t n) const override { return 8 * n * channels_ * positions_; }

 private:           // (mean_ and rstd_ hold [N * P] statistics)
  Tensor scratch_;  // transposed [C, N] copies of a rank-1 batch; backward's partial sums
};

}  // namespace cnnflow
