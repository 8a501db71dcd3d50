#include "ops/layers/flatten.h"

namespace cnnflow {

FlattenLayer::FlattenLayer(const std::string& name, const Args& /*args*/) : Layer(name) {}

Shape FlattenLayer::Build(const std::vector<Shape>& inputs, DType /*dtype*/) {
  CNNFLOW_ENFORCE(inputs.size() == 1, "flatten takes 1 input, got ", inputs.size());
  return Shape{inputs[0].numel()};
}

void FlattenLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                           const ForwardContext& /*ctx*/) {
  // Same bytes, another shape: one memcpy (CopyFrom works on any device).
  y.CopyFrom(x[0]->Reshape(y.shape()));
}

void FlattenLayer::Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& /*y*/,
                            const Tensor& dy, const std::vector<Tensor*>& dx) {
  if (dx[0] != nullptr) dx[0]->CopyFrom(dy.Reshape(dx[0]->shape()));
}

CNNFLOW_REGISTER_LAYER(flatten, FlattenLayer,
                       Schema("Flattens each sample to one dimension: [N, C, H, W] -> "
                              "[N, C*H*W] (torch.nn.Flatten)."));

}  // namespace cnnflow
