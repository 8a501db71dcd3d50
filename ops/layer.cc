#include "ops/layer.h"

namespace cnnflow {

Parameter& Layer::AddParameter(std::string name, const Shape& shape, DType dtype) {
  params_.push_back({std::move(name), Tensor::Zeros(shape, dtype), Tensor::Zeros(shape, dtype)});
  return params_.back();
}

Buffer& Layer::AddBuffer(std::string name, Tensor value) {
  buffers_.push_back({std::move(name), std::move(value)});
  return buffers_.back();
}

void Layer::MoveTo(Device device) {
  for (auto& p : params_) {
    p.value = p.value.To(device);
    p.grad = p.grad.To(device);
  }
  for (auto& b : buffers_) b.value = b.value.To(device);
}

}  // namespace cnnflow
