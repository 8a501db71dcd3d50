// Per-channel learnable scale ("layer_scale"): y = gamma * x, as ConvNeXt's
// and CaiT's layer scale. Its one parameter is named as the layer itself
// (local name ""), as torchvision's `features.1.0.layer_scale` [C, 1, 1] is
// a tensor on the block, not a module's `.weight`; so the layer named
// `features.1.0.layer_scale` loads that state_dict entry as is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// x: [N, C, ...] -> y: [N, C, ...]. Parameter "" (the layer's name): gamma
// [C, 1, 1] for [C, H, W] samples, [C, 1] for [C, L], [C] for [C];
// initialised to `init`.
class LayerScaleLayer : public Layer {
 public:
  LayerScaleLayer(const std::string& name, const Args& args);

  const char* type() const override { return "layer_scale"; }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  void ResetParameters(Rng& rng) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;

  int64_t channels() const { return channels_; }
  int64_t positions() const { return positions_; }  // elements per channel of a sample

 private:
  double init_;
  int64_t channels_ = 0;
  int64_t positions_ = 0;
  Tensor partial_;  // [N, C]: backward's per-sample sums, summed over N in order
};

}  // namespace cnnflow
