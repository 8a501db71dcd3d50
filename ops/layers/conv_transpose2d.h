// Transposed 2D convolution ("conv_transpose2d"), as torch.nn.ConvTranspose2d:
// [N, C, H, W] -> [N, K, H', W'] with weight [C, K/groups, kh, kw] (PyTorch's
// layout for transposed convolutions), bias [K] and
//   H' = (H - 1) * stride - 2 * pad + dilation * (kh - 1) + output_pad + 1.
// It is the adjoint of a convolution: with the "dual" convolution
// [K, H', W'] -> [C, H, W] of the same kernel, stride, pad, dilation and
// groups (whose weight [C, K/groups, kh, kw] is this layer's weight as is),
//   forward           = the dual's backward-data (+ bias),
//   backward-data     = the dual's forward,
//   backward-weights  = the dual's backward-weights with the roles of input
//                       and output gradient swapped.
// So the CPU kernels are conv2d's (Conv2dPasses: im2col/col2im + GEMM or
// oneDNN's convolution primitives, picked per pass by measurement), and the
// f64 path is the same GEMM code the gradient checks cover for conv2d.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops/layer.h"
#include "ops/layers/conv2d.h"

namespace cnnflow {

// YAML: {conv_transpose2d: {out: K, kernel: k | [kh, kw], stride, pad,
// output_pad, dilation, groups, bias}}.
class ConvTranspose2d : public Layer {
 public:
  ConvTranspose2d(const std::string& name, const Args& args);
  ~ConvTranspose2d() override;
  const char* type() const override { return "conv_transpose2d"; }

  // [C, H, W] -> [K, H', W']; creates weight [C, K/groups, kh, kw] and bias [K].
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  // weight, bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = K/groups*kh*kw
  // (torch computes it from weight.size(1)).
  void ResetParameters(Rng& rng) override;
  // x[0]: [N, C, H, W] -> y: [N, K, H', W'].
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  // dy: [N, K, H', W'] -> dx[0]: [N, C, H, W] (optional); adds into the
  // weight and bias gradients.
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  int64_t ForwardFlops(int64_t n) const override;

  // The dual convolution [K, H', W'] -> [C, H, W] (see above): its
  // in_channels are this layer's K, its out_channels this layer's C.
  const Conv2dGeometry& dual() const { return dual_; }
  int64_t output_pad_h() const { return output_pad_h_; }
  int64_t output_pad_w() const { return output_pad_w_; }
  bool has_bias() const { return has_bias_; }

 protected:  // the CUDA class (ops/cuda/conv_transpose2d.cu) reads them
  Conv2dGeometry dual_;
  int64_t output_pad_h_ = 0, output_pad_w_ = 0;
  bool has_bias_ = true;

 private:
  ConvAlgo algo_ = ConvAlgo::kAuto;
  std::unique_ptr<Conv2dPasses> passes_;  // the dual's CPU passes (made by Build)
};

}  // namespace cnnflow
