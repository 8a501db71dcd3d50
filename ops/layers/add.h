// Elementwise sum of two inputs ("add"): the join of a residual connection,
// y = a + b. In YAML the layer names its inputs: `inputs: [conv2, pool1]`.
#pragma once

#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// a: [N, ...], b: [N, ...] (same shape) -> y = a + b: [N, ...].
class AddLayer : public Layer {
 public:
  AddLayer(const std::string& name, const Args& args);

  const char* type() const override { return "add"; }
  int num_inputs() const override { return 2; }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  // dx[0] = dx[1] = dy (masked by y > 0 with a fused ReLU).
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  // y = max(a + b, 0): the residual join and its ReLU in one pass.
  bool FuseRelu() override {
    relu_ = true;
    return true;
  }
  // Elementwise: works in either layout.
  ChannelsLast ChannelsLastSupport() const override { return ChannelsLast::kFollows; }

 private:
  bool relu_ = false;
};

}  // namespace cnnflow
