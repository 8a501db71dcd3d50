// What the per-sample normalisations over channels (layernorm, groupnorm)
// share: eps, the optional per-channel affine map (weight [C] = 1, bias
// [C] = 0, as PyTorch's), the sample's C and P (elements per channel), and
// the statistics the last forward saved for backward.
#pragma once

#include <cstdint>
#include <string>

#include "ops/layer.h"

namespace cnnflow {

class ChannelNormLayer : public Layer {
 public:
  // Reads `eps` (> 0) and `affine`; `type` names the layer in errors.
  ChannelNormLayer(const std::string& name, const Args& args, const char* type);

  void ResetParameters(Rng& rng) override;

  int64_t channels() const { return channels_; }
  int64_t positions() const { return positions_; }  // elements per channel of a sample
  double eps() const { return eps_; }
  bool affine() const { return affine_; }

 protected:
  // Records C and P of sample `s` ([C, ...]) and adds weight and bias when affine.
  void BuildChannels(const Shape& s, DType dtype);

  double eps_;
  bool affine_;
  int64_t channels_ = 0;
  int64_t positions_ = 0;
  Tensor mean_, rstd_;  // the last forward's statistics (their shape is the layer's)
};

}  // namespace cnnflow
