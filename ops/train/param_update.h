// How an optimizer's update reaches a parameter (ops/train/sgd.cc,
// adam.cc): on the host through its own tensors (or copies of a GPU
// parameter that the fused kernels do not take), on a GPU through the fused
// multi-tensor kernels (ops/device_ops.h), with its state kept where the
// update runs.
#pragma once

#include <vector>

#include "ops/device_ops.h"
#include "ops/layer.h"

namespace cnnflow {

// A parameter's value and gradient as host tensors. On the host they are
// the parameter's own tensors; a GPU parameter is copied here and back.
struct HostParam {
  Tensor value;
  Tensor grad;
  bool copied = false;
};
HostParam ToHost(const Parameter& p);
// The update of a copied parameter written back to it.
void WriteBack(Parameter& p, const HostParam& h);

// An f32 parameter whose value and gradient are on one GPU is updated there
// by the fused kernels (ops/cuda/kernels.h); any other (f64 on a GPU, mixed
// devices) goes through host copies.
bool UpdatedOnGpu(const Parameter& p);

// State lives where the update runs; state restored from a checkpoint is
// on the host until the first GPU step moves it.
void MoveState(std::vector<Tensor>& state, Device device);

// A GPU parameter and its state (up to two tensors) as a fused kernel's slot.
ParamSlot Slot(Parameter& p, std::vector<Tensor>& state, bool first);

// Throws ConfigError "optimizer: name must be >= 0, got v".
void CheckNonNegative(const char* optimizer, const char* name, double v);

}  // namespace cnnflow
