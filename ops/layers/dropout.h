// Inverted dropout ("dropout"), as torch.nn.Dropout: in training each
// element is zeroed with probability p and the kept ones are scaled by
// 1 / (1 - p); in evaluation the layer is the identity.
//
// The mask is a pure function of (ctx.seed, ctx.step, the layer's name, the
// element's index in the batch), drawn with the counter-based RNG of
// ops/random.h: the same for any thread count, and reproducible on resume.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// x: [N, ...] -> y: [N, ...] (same shape).
class DropoutLayer : public Layer {
 public:
  DropoutLayer(const std::string& name, const Args& args);

  const char* type() const override { return "dropout"; }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;

  // The random stream of the mask: element j of row n is kept iff
  // UniformAt(MaskKey(ctx, name), s * per_row + j) >= p, where s is the row's
  // sample id (ctx.sample_ids[n], or n without ids). The name is hashed with FNV-1a,
  // stable across compilers and runs (unlike std::hash).
  static uint64_t MaskKey(const ForwardContext& ctx, const std::string& layer_name);

  double p() const { return p_; }
  bool DrawsPerStep() const override { return p_ > 0; }
  // The multiplier of the last training forward ([N, ...]: 0 or 1/(1-p)).
  const Tensor& mask() const { return mask_; }

 private:
  double p_;

 protected:  // the CUDA class (ops/cuda/elementwise.cu) keeps the same state
  // Per-forward state.
  bool last_training_ = false;
  Tensor mask_;
};

}  // namespace cnnflow
