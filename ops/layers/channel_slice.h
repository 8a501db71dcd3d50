// Channel slice ("channel_slice"): channels [start, end) of each sample,
// x[:, start:end] as torch.chunk / torch.split / slicing along dim 1 give
// them (ShuffleNet V2 halves its channels so). Backward writes dy into
// those channels of dx and zeros elsewhere.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// x: [N, C, ...] -> y: [N, end - start, ...], 0 <= start < end <= C.
class ChannelSliceLayer : public Layer {
 public:
  ChannelSliceLayer(const std::string& name, const Args& args);

  const char* type() const override { return "channel_slice"; }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;

  int64_t start() const { return start_; }
  int64_t end() const { return end_; }
  int64_t channels() const { return channels_; }  // the input's
  int64_t plane() const { return plane_; }        // values per channel per sample

 private:
  int64_t start_, end_;
  int64_t channels_ = 0;
  int64_t plane_ = 1;
};

}  // namespace cnnflow
