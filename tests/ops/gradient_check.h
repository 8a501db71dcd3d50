// Gradient checks for layers: central differences in double precision
// against Backward, for every input and parameter element (after Caffe's
// GradientChecker and Flashlight's jacobianTestImpl).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow::testing {

// Builds a registered layer of `type` for the given sample shapes.
inline std::unique_ptr<Layer> MakeLayer(const std::string& type, Args args,
                                        const std::vector<Shape>& sample_shapes,
                                        DType dtype = DType::kF64, uint64_t seed = 1) {
  const LayerType* t = LayerRegistry::Get().Find(type);
  if (t == nullptr) throw Error("no layer type " + type);
  args.FillDefaults(t->schema);
  auto layer = t->create(type + "0", args);
  layer->Build(sample_shapes, dtype);
  Rng rng(seed);
  layer->ResetParameters(rng);
  return layer;
}

// A tensor of uniform values in [lo, hi).
inline Tensor RandomTensor(const Shape& shape, uint64_t seed, double lo = -1, double hi = 1,
                           DType dtype = DType::kF64) {
  Tensor t = Tensor::Empty(shape, dtype);
  Rng rng(seed, 77);
  for (int64_t i = 0; i < t.numel(); ++i) t.Set(i, rng.Uniform(lo, hi));
  return t;
}

// x [N, C, H, W] with its data laid out channels-last ([N, H, W, C], the
// shape unchanged: Layer::ChannelsLast), and back (FromChannelsLast).
inline Tensor ChannelsLastCopy(const Tensor& x, bool to_nhwc) {
  const int64_t n = x.dim(0), c = x.dim(1), p = x.numel() / (n * c);
  Tensor t = Tensor::Empty(x.shape(), x.dtype());
  for (int64_t s = 0; s < n; ++s)
    for (int64_t ci = 0; ci < c; ++ci)
      for (int64_t pi = 0; pi < p; ++pi) {
        const int64_t nchw = (s * c + ci) * p + pi, nhwc = (s * p + pi) * c + ci;
        if (to_nhwc) {
          t.Set(nhwc, x.At(nchw));
        } else {
          t.Set(nchw, x.At(nhwc));
        }
      }
  return t;
}
inline Tensor ToChannelsLast(const Tensor& x) { return ChannelsLastCopy(x, true); }
inline Tensor FromChannelsLast(const Tensor& x) { return ChannelsLastCopy(x, false); }

// Runs Forward and returns the output (shape from out_sample_shape).
inline Tensor RunForward(Layer& layer, const std::vector<Tensor>& inputs, const Shape& out_shape,
                         const ForwardContext& ctx) {
  std::vector<const Tensor*> in;
  for (const auto& t : inputs) in.push_back(&t);
  Tensor y = Tensor::Empty(out_shape, inputs[0].dtype());
  layer.Forward(in, y, ctx);
  return y;
}

struct GradCheckOptions {
  double step = 1e-5;
  // |analytic - numeric| <= abs_tol + rel_tol * max(|analytic|, |numeric|)
  double abs_tol = 1e-7;
  double rel_tol = 1e-5;
  ForwardContext ctx;
  bool check_inputs = true;
};

// Checks d(sum(y * R))/d(x) and d/d(params) for a random R. The layer must
// be built in f64. Kinks (ReLU at 0, max pooling ties) must be avoided by
// the caller's choice of inputs.
inline void CheckGradients(Layer& layer, std::vector<Tensor> inputs, const Shape& out_shape,
                           const GradCheckOptions& opt = {}) {
  const Tensor r = RandomTensor(out_shape, 991);
  auto loss = [&]() {
    Tensor y = RunForward(layer, inputs, out_shape, opt.ctx);
    double s = 0;
    for (int64_t i = 0; i < y.numel(); ++i) s += y.At(i) * r.At(i);
    return s;
  };
  // Analytic.
  for (auto& p : layer.parameters()) p.grad.Zero();
  Tensor y = RunForward(layer, inputs, out_shape, opt.ctx);
  std::vector<Tensor> dx;
  std::vector<Tensor*> dxp;
  std::vector<const Tensor*> in;
  for (auto& t : inputs) {
    dx.push_back(Tensor::Zeros(t.shape(), t.dtype()));
    in.push_back(&t);
  }
  for (auto& t : dx) dxp.push_back(&t);
  layer.Backward(in, y, r, dxp);

  auto compare = [&](const std::string& what, Tensor& value, const Tensor& analytic) {
    int bad = 0;
    for (int64_t i = 0; i < value.numel(); ++i) {
      const double orig = value.At(i);
      value.Set(i, orig + opt.step);
      const double lp = loss();
      value.Set(i, orig - opt.step);
      const double lm = loss();
      value.Set(i, orig);
      const double numeric = (lp - lm) / (2 * opt.step);
      const double a = analytic.At(i);
      const double tol = opt.abs_tol + opt.rel_tol * std::max(std::abs(a), std::abs(numeric));
      if (std::abs(a - numeric) > tol && bad++ < 5) {
        ADD_FAILURE() << layer.type() << " " << what << "[" << i << "]: analytic " << a
                      << " vs numeric " << numeric;
      }
    }
  };
  if (opt.check_inputs) {
    for (size_t k = 0; k < inputs.size(); ++k)
      compare("input" + std::to_string(k), inputs[k], dx[k]);
  }
  for (auto& p : layer.parameters()) {
    Tensor g = p.grad.Clone();
    compare("param " + p.name, p.value, g);
  }
}

}  // namespace cnnflow::testing
