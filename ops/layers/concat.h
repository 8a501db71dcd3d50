// Concatenation along channels ("concat"), as torch.cat(dim=1): the join of
// DenseNet's dense blocks and of Inception's branches. In YAML the layer
// names its inputs, any number >= 2: `inputs: [branch1, branch2, branch3]`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// x_k: [N, C_k, ...] (every other dimension the same) -> y: [N, sum C_k, ...].
class ConcatLayer : public Layer {
 public:
  ConcatLayer(const std::string& name, const Args& args);

  const char* type() const override { return "concat"; }
  int num_inputs() const override { return kVariadicInputs; }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  // dx_k = the channels of dy that x_k filled.
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;

 protected:  // the CUDA class copies the same blocks
  // Elements of one sample that input k contributes (C_k times the rest).
  std::vector<int64_t> block_;
  int64_t out_block_ = 0;  // their sum: elements of one output sample
};

}  // namespace cnnflow
