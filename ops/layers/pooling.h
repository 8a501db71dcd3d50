// Pooling layers with PyTorch's semantics (floor output size):
//   maxpool2d      [C, H, W] -> [C, H', W']  max over each window; padded
//                  cells never win; argmax kept for the backward pass
//   avgpool2d      [C, H, W] -> [C, H', W']  mean over each window
//                  (count_include_pad as in torch.nn.AvgPool2d)
//   global_avgpool [C, H, W] or [C, L] -> [C]  mean over each plane
// H' = (H + 2 * pad - kernel) / stride + 1. Kernels: ops/cpu/pooling.cc,
// parallel over the N*C planes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// Window geometry of a 2D pooling layer on one [H, W] plane.
struct Pool2dGeometry {
  int64_t channels = 0, in_h = 0, in_w = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t out_h = 0, out_w = 0;
  // PyTorch's ceil_mode: the output size rounded up (a last window may hang
  // over the padded input, and is clipped to it), as long as each window
  // starts inside the input or its left/top padding.
  bool ceil_mode = false;

  int64_t in_plane() const { return in_h * in_w; }
  int64_t out_plane() const { return out_h * out_w; }
  // Whether every window lies inside the padded input (always, but for a
  // ceil_mode size that rounded up).
  bool WindowsInside() const {
    return (out_h - 1) * stride_h + kernel_h <= in_h + 2 * pad_h &&
           (out_w - 1) * stride_w + kernel_w <= in_w + 2 * pad_w;
  }
};

// Shared parameter parsing and shape rule of maxpool2d and avgpool2d.
// YAML: {kernel: k | [kh, kw], stride: (0 = kernel), pad: (<= kernel / 2)}.
class Pool2dBase : public Layer {
 public:
  Pool2dBase(const std::string& name, const Args& args);
  // [C, H, W] -> [C, H', W'].
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  const Pool2dGeometry& geometry() const { return geom_; }

 protected:
  Pool2dGeometry geom_;
};

class MaxPool2d : public Pool2dBase {
 public:
  using Pool2dBase::Pool2dBase;
  const char* type() const override { return "maxpool2d"; }
  // x[0]: [N, C, H, W] -> y: [N, C, H', W']; remembers each output's argmax.
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  // dy: [N, C, H', W'] -> dx[0]: [N, C, H, W], routed to the argmax cells.
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  int64_t ForwardFlops(int64_t n) const override;
  // Either layout, [N, C, H, W] or channels-last [N, H, W, C] (windows of
  // at most 256 cells: the argmax is kept as a byte).
  ChannelsLast ChannelsLastSupport() const override {
    return geom_.kernel_h * geom_.kernel_w <= 256 ? ChannelsLast::kFollows : ChannelsLast::kNo;
  }
  // Channels-last with windows that tile the input: dx may be bf16 (each
  // cell is dy's value or 0, so rounding it is rounding dy).
  bool WritesBf16Grad(size_t input) const override;

 private:
  // Per forward, NCHW: index in its input plane (h * W + w) of each
  // output's max; channels-last: its offset in the window (i * kw + j),
  // laid out as the output.
  std::vector<int32_t> argmax_;
  std::vector<uint8_t> window_argmax_;
};

class AvgPool2d : public Pool2dBase {
 public:
  AvgPool2d(const std::string& name, const Args& args);
  const char* type() const override { return "avgpool2d"; }
  // x[0]: [N, C, H, W] -> y: [N, C, H', W'].
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  // dy: [N, C, H', W'] -> dx[0]: [N, C, H, W].
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  int64_t ForwardFlops(int64_t n) const override;
  bool count_include_pad() const { return count_include_pad_; }

 private:
  bool count_include_pad_ = true;
};

// No parameters. [C, H, W] or [C, L] -> [C] (already flattened for a
// following linear layer).
class GlobalAvgPool : public Layer {
 public:
  GlobalAvgPool(const std::string& name, const Args& args);
  const char* type() const override { return "global_avgpool"; }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  // x[0]: [N, C, ...] -> y: [N, C].
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  // dy: [N, C] -> dx[0]: [N, C, ...], each cell dy / plane size.
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  int64_t ForwardFlops(int64_t n) const override;

 private:
  int64_t channels_ = 0, plane_ = 0;
};

}  // namespace cnnflow
