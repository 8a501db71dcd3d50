// 1D convolution layer ("conv1d"): [N, C, L] -> [N, K, L'] for time series
// and audio, with stride, zero padding, dilation and groups, PyTorch's
// nn.Conv1d parameter layout (weight [K, C/groups, k], bias [K]) and output
// size rule L' = (L + 2 * pad - dilation * (k - 1) - 1) / stride + 1.
//
// Two CPU lowerings (ops/cpu/conv1d.cc), both deterministic for any thread
// count:
//  - stride 1 with C/groups >= 8 (every layer after the first in a 1D
//    CNN): one GEMM per tap on a shifted view of the input, no im2col;
//  - otherwise (strided first layers on raw audio, few channels): conv2d's
//    im2col + GEMM kernels on [C, 1, L] with a 1 x k kernel (this class
//    derives from Conv2d for them).
#pragma once

#include <string>
#include <vector>

#include "ops/layers/conv2d.h"

namespace cnnflow {

// YAML: {conv1d: {out: K, kernel: k, stride, pad, dilation, groups, bias,
// in}}. Sample shapes: [C, L] -> [K, L'].
class Conv1d : public Conv2d {
 public:
  Conv1d(const std::string& name, const Args& args);
  const char* type() const override { return "conv1d"; }

  // [C, L] -> [K, L']; creates weight [K, C/groups, k] and bias [K].
  // ResetParameters (inherited): U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with
  // fan_in = C/groups * k, as nn.Conv1d.
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  // x[0]: [N, C, L]; y: [N, K, L'].
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  // dy: [N, K, L'] -> dx[0]: [N, C, L] (optional); adds into the weight and
  // bias gradients.
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;

  // Not fused: the shifted-GEMM kernels have no ReLU epilogue (a conv1d is
  // mostly followed by batchnorm, which takes the ReLU).
  bool FuseRelu() override { return false; }

  // Which lowering Build chose: true = per-tap shifted GEMMs.
  bool uses_shifted_gemm() const { return shifted_; }

  // One kernel tap of the shifted-GEMM lowering: output o reads input
  // o + shift; outputs [lo, hi) read inside [0, L).
  struct Tap {
    int64_t shift = 0, lo = 0, hi = 0;
  };

 private:
  int64_t in_arg_ = 0;  // the `in` parameter: 0 = infer from the input shape
  bool shifted_ = false;
  std::vector<Tap> taps_;
};

}  // namespace cnnflow
