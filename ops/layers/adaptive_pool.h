// Adaptive average pooling, as torch.nn.AdaptiveAvgPool2d / AdaptiveAvgPool1d:
//   adaptive_avgpool2d  [C, H, W] -> [C, h, w]   YAML {out: [h, w]} or {out: s}
//   adaptive_avgpool1d  [C, L] -> [C, l]         YAML {out: l}
// Along an axis of n inputs and m outputs, output i averages the inputs
// [AdaptiveStart(i), AdaptiveEnd(i)) = [floor(i*n/m), ceil((i+1)*n/m)):
// windows may overlap (n % m != 0) or repeat cells (m > n). The 1D layer
// is the 2D kernels on [C, 1, L]. Kernels: ops/cpu/adaptive_pool.cc,
// parallel over the N*C planes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

inline int64_t AdaptiveStart(int64_t i, int64_t in, int64_t out) { return i * in / out; }
inline int64_t AdaptiveEnd(int64_t i, int64_t in, int64_t out) {
  return ((i + 1) * in + out - 1) / out;
}

struct AdaptivePoolGeometry {
  int64_t channels = 0, in_h = 1, in_w = 0, out_h = 1, out_w = 0;
  int64_t in_plane() const { return in_h * in_w; }
  int64_t out_plane() const { return out_h * out_w; }
};

// Both layer types; `rank` 2 is adaptive_avgpool1d, 3 adaptive_avgpool2d
// (the rank of the sample shape).
class AdaptiveAvgPool : public Layer {
 public:
  AdaptiveAvgPool(const std::string& name, const Args& args, int rank);
  const char* type() const override {
    return rank_ == 3 ? "adaptive_avgpool2d" : "adaptive_avgpool1d";
  }
  // [C, H, W] -> [C, h, w], or [C, L] -> [C, l].
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  // x[0]: [N, C, H, W] (or [N, C, L]) -> y: [N, C, h, w] (or [N, C, l]).
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  // dy -> dx[0] (overwritten): each output's gradient / its window size,
  // summed over the windows that hold a cell.
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  int64_t ForwardFlops(int64_t n) const override;

  const AdaptivePoolGeometry& geometry() const { return geom_; }
  int rank() const { return rank_; }

 private:
  int rank_;
  AdaptivePoolGeometry geom_;
};

class AdaptiveAvgPool2d : public AdaptiveAvgPool {
 public:
  AdaptiveAvgPool2d(const std::string& name, const Args& args) : AdaptiveAvgPool(name, args, 3) {}
};
class AdaptiveAvgPool1d : public AdaptiveAvgPool {
 public:
  AdaptiveAvgPool1d(const std::string& name, const Args& args) : AdaptiveAvgPool(name, args, 2) {}
};

}  // namespace cnnflow
