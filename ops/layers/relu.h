// The rectifier ("relu"): y = max(x, 0), elementwise, any shape.
#pragma once

#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// x: [N, ...] -> y: [N, ...] (same shape). Backward uses y (dx = dy where
// y > 0), as PyTorch does, so it does not need x.
class ReluLayer : public Layer {
 public:
  ReluLayer(const std::string& name, const Args& args);

  const char* type() const override { return "relu"; }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  // Elementwise: works in either layout.
  ChannelsLast ChannelsLastSupport() const override { return ChannelsLast::kFollows; }
};

}  // namespace cnnflow
