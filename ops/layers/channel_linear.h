// A linear map over the channels at each position ("channel_linear"):
// torch.nn.Linear applied to the channel vector of every position of a
// [C, H, W] or [C, L] sample, as ConvNeXt's block.3 / block.5 (which PyTorch
// runs on NHWC permuted activations). Equal to a 1x1 convolution, but with
// nn.Linear's weight layout [out, in] and initialisation, so a ConvNeXt
// state_dict loads as is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// x: [N, C, ...] -> y: [N, K, ...]: y[n, :, p] = W x[n, :, p] + b.
// Parameters: weight [K, C], bias [K] (when `bias: true`).
class ChannelLinearLayer : public Layer {
 public:
  ChannelLinearLayer(const std::string& name, const Args& args);

  const char* type() const override { return "channel_linear"; }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  // weight and bias ~ U(-1/sqrt(C), 1/sqrt(C)) (nn.Linear's default).
  void ResetParameters(Rng& rng) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  int64_t ForwardFlops(int64_t n) const override { return 2 * n * in_ * out_ * positions_; }

  int64_t in_channels() const { return in_; }
  int64_t out_channels() const { return out_; }
  int64_t positions() const { return positions_; }  // elements per channel of a sample
  bool has_bias() const { return has_bias_; }

 private:
  int64_t in_ = 0;
  int64_t out_;
  int64_t positions_ = 0;
  bool has_bias_;
  Tensor partial_;  // backward's per-chunk sums of dW and db
};

}  // namespace cnnflow
