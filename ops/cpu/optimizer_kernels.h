// The host loops of the optimizers' updates (ops/train/optimizer.h: the
// rules and their state): torch.optim's arithmetic, in the same order, over
// parallel ranges of a parameter. Adam's square roots are vector
// instructions chosen at run time (ops/cpu/isa.h); they are correctly
// rounded, so every ISA gives the same bits as the scalar loop.
#pragma once

#include <cstdint>

namespace cnnflow::cpu {

// SGD: g = grad + wd * p; buf = g at the first step, else mu * buf +
// (1 - dampening) * g; g = nesterov ? g + mu * buf : buf; p -= lr * g.
// `buf` null: no momentum.
struct SgdScalars {
  double weight_decay = 0;
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
};
template <typename T>
void SgdUpdate(T* p, const T* grad, T* buf, bool first, int64_t n, const SgdScalars& s, double lr);

// Adam(W) at one step: the constants of that step.
struct AdamScalars {
  double decay_factor;  // AdamW: 1 - lr * wd; 1 otherwise
  double l2;            // Adam: wd; 0 otherwise
  double beta1, beta2, eps;
  double step_size;  // lr / (1 - beta1^t)
  double bc2_sqrt;   // sqrt(1 - beta2^t)
};
template <typename T>
void AdamUpdate(T* p, const T* grad, T* m, T* v, int64_t n, const AdamScalars& s);

}  // namespace cnnflow::cpu
