// The rows of the layer table (tests/ops/layers/layer_table_test.cc) and how one row
// is run: a layer built from its registered type, its inputs and output
// gradient drawn from fixed seeds, so every check of a row (f64, f32, GPU,
// ONNX) sees the same values.
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow::testing {

struct LayerCase {
  std::string type;
  Args args;                  // defaults filled from the type's schema
  std::vector<Shape> inputs;  // sample shapes (no batch dimension)
  std::string variant;        // what sets this row apart, for its test name
  int64_t batch = 2;
  double lo = -2, hi = 2;  // inputs ~ U(lo, hi)
  bool training = true;
  // Tolerances: the gradient check (f64), f32 against f64 and GPU against
  // CPU (relative to each tensor's largest value).
  double grad_rel_tol = 1e-5;
  double grad_abs_tol = 1e-7;
  double f32_tol = 1e-5;
  double gpu_tol = 1e-5;
  bool grad_check = true;
  std::string why_no_grad_check;

  ForwardContext Context() const;
  std::string Label() const;                 // "conv2d(stride2) [3, 9, 9]"
  std::string TestName(size_t index) const;  // gtest-safe
};

// Every row.
const std::vector<LayerCase>& LayerCases();
// gtest prints a row as its label.
inline void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.Label(); }

// One row's layer in `dtype` on `device`, with inputs drawn from the row's
// seeds; with `like`, the parameters, buffers and inputs are like's (cast),
// so two runs compare kernel against kernel on the same values.
class LayerRun {
 public:
  LayerRun(const LayerCase& c, DType dtype, Device device, const LayerRun* like = nullptr);

  // Forward (the row's context), then Backward with a fixed random dy,
  // every input gradient wanted.
  void ForwardBackward();

  Layer& layer() { return *layer_; }
  const std::vector<Tensor>& inputs() const { return inputs_; }
  const Shape& output_shape() const { return out_shape_; }
  const Tensor& y() const { return y_; }
  const std::vector<Tensor>& dx() const { return dx_; }

 private:
  const LayerCase& case_;
  DType dtype_;
  Device device_;
  std::unique_ptr<Layer> layer_;
  std::vector<Tensor> inputs_;
  Shape out_shape_;
  Tensor y_;
  std::vector<Tensor> dx_;
};

}  // namespace cnnflow::testing
