#include "ops/train/param_update.h"

#include "ops/error.h"

namespace cnnflow {

HostParam ToHost(const Parameter& p) {
  if (p.value.device().is_cpu() && p.grad.device().is_cpu()) return {p.value, p.grad, false};
  return {p.value.To(Device::Cpu()), p.grad.To(Device::Cpu()), true};
}

void WriteBack(Parameter& p, const HostParam& h) {
  if (h.copied) p.value.CopyFrom(h.value);
}

bool UpdatedOnGpu(const Parameter& p) {
  return p.value.device().is_cuda() && p.grad.device() == p.value.device() &&
         p.value.dtype() == DType::kF32;
}

void MoveState(std::vector<Tensor>& state, Device device) {
  for (Tensor& t : state) {
    if (t.device() != device) t = t.To(device);
  }
}

ParamSlot Slot(Parameter& p, std::vector<Tensor>& state, bool first) {
  ParamSlot slot;
  slot.value = p.value.data<float>();
  slot.grad = p.grad.data<float>();
  slot.state0 = state.size() > 0 ? state[0].data<float>() : nullptr;
  slot.state1 = state.size() > 1 ? state[1].data<float>() : nullptr;
  slot.numel = p.value.numel();
  slot.first = first;
  return slot;
}

void CheckNonNegative(const char* optimizer, const char* name, double v) {
  if (!(v >= 0)) {
    throw ConfigError(StrCat(optimizer, ": ", name, " must be >= 0, got ", v));
  }
}

}  // namespace cnnflow
