// Channel shuffle ("channel_shuffle"), as torch.nn.ChannelShuffle and
// ShuffleNet's channel_shuffle: the C = g * k channels, seen as g groups of
// k, are interleaved so that output channel j * g + i is input channel
// i * k + j (x.view(N, g, k, ...).transpose(1, 2).reshape(N, C, ...)).
// Only the order of the channel planes changes; backward applies the
// inverse permutation to dy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// x: [N, C, ...] -> y: [N, C, ...], C divisible by groups.
class ChannelShuffleLayer : public Layer {
 public:
  ChannelShuffleLayer(const std::string& name, const Args& args);

  const char* type() const override { return "channel_shuffle"; }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;

  int64_t groups() const { return groups_; }
  int64_t channels() const { return channels_; }
  int64_t plane() const { return plane_; }  // values per channel per sample
  // The input channel that output channel `c` holds.
  int64_t Source(int64_t c) const { return (c % groups_) * (channels_ / groups_) + c / groups_; }

 private:
  int64_t groups_;
  int64_t channels_ = 0;
  int64_t plane_ = 1;
};

}  // namespace cnnflow
