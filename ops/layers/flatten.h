// Flattening ("flatten"): [N, C, H, W] (any sample rank) -> [N, C*H*W], as
// torch.nn.Flatten(). Only the shape changes; the data is copied as is.
#pragma once

#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// x: [N, d1, ..., dk] -> y: [N, d1 * ... * dk]; element order is unchanged.
class FlattenLayer : public Layer {
 public:
  FlattenLayer(const std::string& name, const Args& args);

  const char* type() const override { return "flatten"; }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
};

}  // namespace cnnflow
