#include "ops/layer.h"

#include <algorithm>

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

LayerRegistry& LayerRegistry::Get() {
  static LayerRegistry* registry = new LayerRegistry();
  return *registry;
}

void LayerRegistry::Register(LayerType t) {
  CNNFLOW_ENFORCE(Find(t.type) == nullptr, "layer type '", t.type, "' registered twice");
  for (auto it = cuda_.begin(); it != cuda_.end(); ++it) {
    if (it->first == t.type) {
      t.create_cuda = std::move(it->second);
      cuda_.erase(it);
      break;
    }
  }
  types_.push_back(std::move(t));
}

void LayerRegistry::RegisterCuda(const std::string& type, LayerFactory create) {
  for (auto& t : types_) {
    if (t.type == type) {
      CNNFLOW_ENFORCE(!t.create_cuda, "CUDA layer '", type, "' registered twice");
      t.create_cuda = std::move(create);
      return;
    }
  }
  cuda_.emplace_back(type, std::move(create));
}

const LayerType* LayerRegistry::Find(const std::string& type) const {
  for (const auto& t : types_)
    if (t.type == type) return &t;
  return nullptr;
}

std::vector<std::string> LayerRegistry::Names() const {
  std::vector<std::string> n;
  for (const auto& t : types_) n.push_back(t.type);
  std::sort(n.begin(), n.end());
  return n;
}

LayerRegistration::LayerRegistration(const char* type, Schema schema, LayerFactory create) {
  LayerRegistry::Get().Register({type, std::move(schema), std::move(create), {}});
}

CudaLayerRegistration::CudaLayerRegistration(const char* type, LayerFactory create) {
  LayerRegistry::Get().RegisterCuda(type, std::move(create));
}

}  // namespace cnnflow
