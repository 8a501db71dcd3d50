// Stochastic depth ("drop_path"), as torchvision.ops.StochasticDepth with
// mode "row": in training each SAMPLE's whole tensor is zeroed with
// probability p and the kept samples are scaled by 1 / (1 - p); in
// evaluation, or with p = 0, the layer is the identity.
//
// Sample n is kept iff UniformAt(DropoutLayer::MaskKey(ctx, name), s) >= p,
// s = ctx.sample_ids[n] (or n without ids): dropout's keyed stream
// (ops/layers/dropout.h) with one draw per sample, so the decision is the
// same on any replica, shard or micro-batch, and on resume.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// x: [N, ...] -> y: [N, ...] (same shape).
class DropPathLayer : public Layer {
 public:
  DropPathLayer(const std::string& name, const Args& args);

  const char* type() const override { return "drop_path"; }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;

  double p() const { return p_; }
  bool DrawsPerStep() const override { return p_ > 0; }
  // The multiplier of each sample in the last training forward (0 or
  // 1/(1-p)); empty after an evaluation forward.
  const std::vector<double>& row_scale() const { return row_scale_; }

 protected:
  // Fills row_scale_ for the n samples of a forward under ctx; false when
  // the layer is the identity (evaluation or p = 0).
  bool DrawRows(int64_t n, const ForwardContext& ctx);

  std::vector<double> row_scale_;

 private:
  double p_;
};

}  // namespace cnnflow
