// 1D pooling layers over [N, C, L] (time series, audio), PyTorch's
// semantics (floor output size L' = (L + 2 * pad - kernel) / stride + 1):
//   maxpool1d  [C, L] -> [C, L']  max over each window (torch.nn.MaxPool1d;
//              padded cells never win; a NaN wins, so it propagates)
//   avgpool1d  [C, L] -> [C, L']  mean over each window (torch.nn.AvgPool1d;
//              count_include_pad true by default, as PyTorch)
// Global average pooling over L is `global_avgpool` (ops/layers/pooling.h): it
// takes [C, L] as well as [C, H, W]. Kernels: ops/cpu/pooling1d.cc,
// parallel over the N*C rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// Window geometry of a 1D pooling layer on one row of length L.
struct Pool1dGeometry {
  int64_t channels = 0, in_len = 0;  // C, L
  int64_t kernel = 1, stride = 1, pad = 0;
  int64_t out_len = 0;  // L'
  // Outputs [interior_begin, interior_end) have windows wholly inside the
  // row (no padding, no clipping): the fast path.
  int64_t interior_begin = 0, interior_end = 0;
};

// Shared parameter parsing and shape rule of maxpool1d and avgpool1d.
// YAML: {kernel: k, stride: (0 = kernel), pad: (<= kernel / 2)}.
class Pool1dBase : public Layer {
 public:
  // type_name: the registered type, for messages (type() is not yet
  // callable in a base constructor).
  Pool1dBase(const std::string& name, const Args& args, const char* type_name);
  // [C, L] -> [C, L'].
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  // Compares per output element (n * C * L' * kernel).
  int64_t ForwardFlops(int64_t n) const override;
  const Pool1dGeometry& geometry() const { return geom_; }

 protected:
  Pool1dGeometry geom_;
};

class MaxPool1d : public Pool1dBase {
 public:
  MaxPool1d(const std::string& name, const Args& args);
  const char* type() const override { return "maxpool1d"; }
  // x[0]: [N, C, L] -> y: [N, C, L']; remembers each output's argmax.
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  // dy: [N, C, L'] -> dx[0]: [N, C, L], routed to the argmax cells.
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;

 private:
  // Per forward: index in its input row of each output's max, [N, C, L'].
  std::vector<int32_t> argmax_;
};

class AvgPool1d : public Pool1dBase {
 public:
  AvgPool1d(const std::string& name, const Args& args);
  const char* type() const override { return "avgpool1d"; }
  // x[0]: [N, C, L] -> y: [N, C, L'].
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  // dy: [N, C, L'] -> dx[0]: [N, C, L].
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  bool count_include_pad() const { return count_include_pad_; }

 private:
  bool count_include_pad_ = true;
};

}  // namespace cnnflow
