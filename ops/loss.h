// The loss contract: losses on logits (not layers: the training step calls
// them on the model's output). Softmax cross-entropy as
// torch.nn.CrossEntropyLoss (mean reduction, optional label smoothing); the
// CPU kernel (ops/cpu/softmax_cross_entropy.cc) and the device seam
// (ops/device_ops.h) implement it, so it sits below both.
#pragma once

#include <cstdint>

#include "ops/tensor.h"

namespace cnnflow {

struct LossResult {
  double loss = 0;      // mean over the batch
  int64_t correct = 0;  // rows whose argmax equals the label
};

// Mixed targets (mixup, cutmix): row i's target is weight[i] of labels[i]'s
// one-hot and 1 - weight[i] of other[i]'s.
struct LabelMix {
  const int64_t* other = nullptr;
  const float* weight = nullptr;
};

// logits: [N, K] (f32 or f64); labels: N values in [0, K) (else Error naming
// the index and the value). When dlogits ([N, K], logits' dtype) is not
// null, writes grad_scale * dL_sum/dlogits = grad_scale * (softmax - target)
// into it; grad_scale < 0 means 1/N, the gradient of the mean (data-parallel
// replicas pass 1 / global batch). label_smoothing e mixes the one-hot target
// with the uniform distribution: target = (1 - e) * onehot + e / K. With
// `mix`, onehot is the mixed target, and a row counts as correct when its
// argmax is the label of the larger weight.
// Computed with max subtraction (log-sum-exp) in double.
LossResult SoftmaxCrossEntropy(const Tensor& logits, const int64_t* labels, Tensor* dlogits,
                               double grad_scale = -1, double label_smoothing = 0.0,
                               const LabelMix* mix = nullptr);

// A loss that may still be on its way back from a device (a GPU's comes
// back through pinned memory while the host goes on issuing backward).
// Get() waits for it once, and throws then for a bad label; later calls
// return it again. ops/device_ops.h makes them.
class PendingLoss {
 public:
  virtual ~PendingLoss() = default;
  virtual bool ready() const = 0;  // Get() will not wait
  virtual LossResult Get() = 0;
};

}  // namespace cnnflow
