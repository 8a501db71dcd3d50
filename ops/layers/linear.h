// The fully connected layer ("linear"): y = x W^T + b, as torch.nn.Linear.
// A sample of any rank is flattened first ([F] or [C, H, W] -> F = numel),
// so no separate flatten is needed before the first linear layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// x: [N, ...] with F = numel of a sample -> y: [N, out].
// Parameters: weight [out, F], bias [out] (when `bias: true`).
class LinearLayer : public Layer {
 public:
  LinearLayer(const std::string& name, const Args& args);

  const char* type() const override { return "linear"; }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  // weight and bias ~ U(-1/sqrt(F), 1/sqrt(F)) (PyTorch's default).
  void ResetParameters(Rng& rng) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  int64_t ForwardFlops(int64_t n) const override { return 2 * n * in_ * out_; }
  // The three GEMMs with bf16 products from now on (cpu::GemmBf16).
  bool ComputeInBf16() override {
    bf16_ = true;
    return true;
  }

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  bool has_bias() const { return has_bias_; }

 private:
  int64_t in_;  // 0 until Build when not given
  int64_t out_;
  bool has_bias_;
  bool bf16_ = false;
};

}  // namespace cnnflow
