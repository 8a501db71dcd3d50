// Upsampling ("upsample"), as torch.nn.Upsample / F.interpolate on
// [C, H, W] -> [C, H', W']:
//   YAML {upsample: {scale: s | [sh, sw], mode: nearest | bilinear,
//                    align_corners: false}}  H' = floor(H * sh)
//     or {upsample: {size: [H', W'], mode: ...}}
// Per axis, output o reads inputs i0[o] and i1[o] with weights 1 - l1[o]
// and l1[o] (ResizeAxis), computed exactly as PyTorch's CPU kernels do,
// in the tensor's precision:
//   nearest   PyTorch's legacy 'nearest': i0 = i1 = min(floor(o * r), n-1)
//             in f32, r = 1/scale when a scale is given, else n/m (and the
//             identity / o >> 1 special cases of m == n / m == 2n)
//   bilinear  src = r * (o + 0.5) - 0.5 clipped at 0 (align_corners false;
//             r as above), or src = o * (n-1)/(m-1) (align_corners true);
//             i0 = floor(src), i1 = i0 + 1 below the edge, l1 = src - i0
// Backward gathers (see ops/cpu/upsample.cc); the outputs that read input
// index h along an axis are [lo[h], hi[h]) (both index maps are monotone).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

template <typename T>
struct ResizeAxis {
  std::vector<int64_t> i0, i1;  // per output
  std::vector<T> l1;            // per output: the weight of i1 (nearest: 0)
  std::vector<int64_t> lo, hi;  // per input: the outputs that read it
};

// The map of an axis of `in` inputs to `out` outputs; scale > 0: the
// user's scale factor (PyTorch then uses 1/scale), 0: sizes given.
// Defined for float and double (ops/cpu/upsample.cc).
template <typename T>
ResizeAxis<T> MakeResizeAxis(int64_t in, int64_t out, double scale, bool bilinear,
                             bool align_corners);

class Upsample : public Layer {
 public:
  Upsample(const std::string& name, const Args& args);
  const char* type() const override { return "upsample"; }
  // [C, H, W] -> [C, H', W'].
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  // x[0]: [N, C, H, W] -> y: [N, C, H', W'].
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  // dy: [N, C, H', W'] -> dx[0]: [N, C, H, W] (overwritten).
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  int64_t ForwardFlops(int64_t n) const override;

  bool bilinear() const { return bilinear_; }
  bool align_corners() const { return align_corners_; }
  // The user's scale factors (0 when the size was given) and the shapes.
  double scale_h() const { return scale_h_; }
  double scale_w() const { return scale_w_; }
  int64_t channels() const { return channels_; }
  int64_t in_h() const { return in_h_; }
  int64_t in_w() const { return in_w_; }
  int64_t out_h() const { return out_h_; }
  int64_t out_w() const { return out_w_; }

 private:
  bool bilinear_ = false, align_corners_ = false;
  double scale_h_ = 0, scale_w_ = 0;
  int64_t size_h_ = 0, size_w_ = 0;
  int64_t channels_ = 0, in_h_ = 0, in_w_ = 0, out_h_ = 0, out_w_ = 0;
};

}  // namespace cnnflow
