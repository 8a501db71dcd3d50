// Elementwise product ("mul"), in two forms:
//   mul: {}            with `inputs: [x, s]`: y = x * s, where s has x's
//                      shape or broadcasts over x's trailing dimensions: s
//                      [C, 1, 1], [C, 1] or [C] times x [C, H, W] (a
//                      squeeze-excitation gate). Unlike NumPy, dimensions
//                      align from the LEADING (channel) end, so the [N, C]
//                      output of a linear layer gates [N, C, H, W] as is.
//   mul: {scale: a}    with one input: y = a * x (a constant; airbench's 1/9).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// x: [N, ...], s: [N, ...] (see above) -> y: [N, ...] (x's shape).
class MulLayer : public Layer {
 public:
  MulLayer(const std::string& name, const Args& args);

  const char* type() const override { return "mul"; }
  int num_inputs() const override { return has_scale_ ? 1 : 2; }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  // dx = dy * s; ds = dy * x summed over the dimensions s broadcasts over.
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  // By a constant it is elementwise (either layout); by a tensor it
  // broadcasts over NCHW positions.
  ChannelsLast ChannelsLastSupport() const override {
    return has_scale_ ? ChannelsLast::kFollows : ChannelsLast::kNo;
  }

  bool has_scale() const { return has_scale_; }
  double scale() const { return scale_; }
  // Elements of a sample of s (M) and how many of x's each one multiplies (R).
  int64_t factor_size() const { return factors_; }
  int64_t repeat() const { return repeat_; }

 private:
  bool has_scale_;
  double scale_ = 1;
  int64_t factors_ = 0;
  int64_t repeat_ = 0;
};

}  // namespace cnnflow
