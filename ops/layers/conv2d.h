// 2D convolution layer ("conv2d"): [N, C, H, W] -> [N, K, H', W'], with
// stride, zero padding, dilation and groups, PyTorch's parameter layout
// (weight [K, C/groups, kh, kw], bias [K]) and output size rule
//   H' = (H + 2 * pad_h - dilation_h * (kh - 1) - 1) / stride_h + 1.
// The CPU kernels (ops/cpu/conv/) are im2col + GEMM or oneDNN's
// convolution primitives, chosen per pass by measurement (`algo`), parallel
// over the batch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// Everything a convolution kernel needs to know about the shapes; shared by
// the CPU and (later) CUDA kernels.
struct Conv2dGeometry {
  int64_t in_channels = 0, in_h = 0, in_w = 0;  // C, H, W
  int64_t out_channels = 0;                     // K
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
  int64_t out_h = 0, out_w = 0;  // H', W'

  int64_t in_per_group() const { return in_channels / groups; }    // C / groups
  int64_t out_per_group() const { return out_channels / groups; }  // K / groups
  // Rows of the im2col matrix of one group: (C / groups) * kh * kw.
  int64_t col_rows() const { return in_per_group() * kernel_h * kernel_w; }
  int64_t in_plane() const { return in_h * in_w; }
  int64_t out_plane() const { return out_h * out_w; }
  // A 1x1, stride-1, unpadded convolution is a plain GEMM on the input.
  bool is_pointwise() const {
    return kernel_h == 1 && kernel_w == 1 && stride_h == 1 && stride_w == 1 && pad_h == 0 &&
           pad_w == 0;
  }
};

// Output extent of a convolution or pooling window along one axis (floor
// rule); may be <= 0 when the window does not fit.
inline int64_t ConvOutputSize(int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                              int64_t dilation = 1) {
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

// Per-thread scratch buffers of the CPU kernels (defined in ops/cpu/conv/scratch.h).
struct Conv2dScratch;

// The CPU algorithms of a convolution pass. kAuto: measured (see
// ops/cpu/conv/picks.h); f64 always runs kGemm (oneDNN has no f64 convolution).
// bf16 only: kMatmul, backward-weights as im2col and oneDNN's matmul
// (OnednnConv::BackwardWeightsByMatmul); kFlipped, backward-data as a
// forward convolution (OnednnConv::BackwardDataByFlippedForward).
enum class ConvAlgo { kAuto, kGemm, kOnednn, kMatmul, kFlipped };
const char* ConvAlgoName(ConvAlgo a);

// What runs each pass of one layer at one batch size.
struct Conv2dPlan {
  ConvAlgo forward = ConvAlgo::kGemm;
  ConvAlgo backward_data = ConvAlgo::kGemm;
  ConvAlgo backward_weights = ConvAlgo::kGemm;
  // bf16 only: the bf16-rounded operands multiplied by oneDNN's f32 kernels
  // (cpu::OnednnConv's f32_kernels), where they measure faster than its bf16 ones.
  bool f32_kernels = false;
};

// One geometry's CPU passes, each alone, on caller-owned tensors (no
// bias, no fused ReLU): for layers that run a convolution's passes in other
// roles, as conv_transpose2d (whose forward is this backward-data). The
// same kernels, per-shape algorithm picks and determinism as Conv2d's.
class Conv2dPasses {
 public:
  Conv2dPasses(const Conv2dGeometry& g, ConvAlgo algo);
  ~Conv2dPasses();
  Conv2dPasses(const Conv2dPasses&) = delete;
  Conv2dPasses& operator=(const Conv2dPasses&) = delete;

  const Conv2dGeometry& geometry() const { return geom_; }
  // x [n, C, H, W], w [K, C/groups, kh, kw] -> y [n, K, H', W'] (overwritten).
  void Forward(const Tensor& x, const Tensor& w, Tensor& y);
  // w, dy [n, K, H', W'] -> dx [n, C, H, W] (overwritten).
  void BackwardData(const Tensor& w, const Tensor& dy, Tensor& dx);
  // x [n, C, H, W], dy [n, K, H', W'] -> dw [K, C/groups, kh, kw] (added into).
  void BackwardWeights(const Tensor& x, const Tensor& dy, Tensor& dw);

 private:
  Conv2dGeometry geom_;
  ConvAlgo algo_;
  std::unique_ptr<Conv2dScratch> scratch_;
};

// YAML: {conv2d: {out: K, kernel: k | [kh, kw], stride, pad, dilation,
// groups, bias, in}}. Sample shapes: [C, H, W] -> [K, H', W'].
class Conv2d : public Layer {
 public:
  Conv2d(const std::string& name, const Args& args);
  ~Conv2d() override;
  const char* type() const override { return "conv2d"; }

  // [C, H, W] -> [K, H', W']; creates weight [K, C/groups, kh, kw] and bias [K].
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  // weight, bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = C/groups*kh*kw.
  void ResetParameters(Rng& rng) override;
  // x[0]: [N, C, H, W]; y: [N, K, H', W'].
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  // dy: [N, K, H', W'] -> dx[0]: [N, C, H, W] (optional); adds into the
  // weight and bias gradients.
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  int64_t ForwardFlops(int64_t n) const override;
  // y = max(conv(x), 0) from now on (in the GEMM epilogue, or oneDNN's
  // post-op), dy masked by y > 0 in backward.
  bool FuseRelu() override {
    relu_ = true;
    return true;
  }
  // Every pass through oneDNN's bf16 primitives from now on, whatever
  // `algo` says (the GEMM path is f32 only).
  bool ComputeInBf16() override;
  // In bf16 its oneDNN kernels read and write NHWC: either side may be.
  ChannelsLast ChannelsLastSupport() const override;
  void SetChannelsLast(const std::vector<bool>& inputs, bool output) override;
  // In bf16 with a channels-last input, x may be bf16 too: the kernels read
  // it as it is, and its backward-weights too.
  bool ReadsBf16(size_t input) const override;
  // And dy, with a channels-last output and no fused ReLU.
  bool ReadsBf16Grad() const override;

  const Conv2dGeometry& geometry() const { return geom_; }
  bool has_bias() const { return has_bias_; }
  // The algorithms of a batch of n in `dtype` on the CPU (measured on the
  // first call for an n with `algo: auto`, then cached).
  Conv2dPlan PlanFor(int64_t n, DType dtype);
  // The key of this layer's shape at batch n in the kernel pick cache
  // (ops/cpu/conv/pick_cache.h).
  std::string KernelPickKey(int64_t n) const;

 private:
  Conv2dGeometry geom_;
  bool has_bias_ = true;
  ConvAlgo algo_ = ConvAlgo::kAuto;
  bool relu_ = false;   // a fused ReLU (FuseRelu)
  int64_t in_arg_ = 0;  // the `in` parameter: 0 = infer from the input shape
  std::unique_ptr<Conv2dScratch> scratch_;
};

}  // namespace cnnflow
