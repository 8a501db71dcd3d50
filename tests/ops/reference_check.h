// Checks of a layer against an independent naive f64 reference, for the
// layers of issue 29 (concat, mul, layer_scale, channel_linear, layernorm,
// groupnorm): the f64 kernels against the reference to ~1e-12, the f32
// kernels against it to a stated tolerance, and the f32 backward against
// the f64 backward (which tests/ops/gradient_check.h verifies).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/ops/gradient_check.h"

namespace cnnflow::testing {

// A built layer in f64 with random parameters (uniform in [lo, hi)), random
// inputs of the batch shapes, and the same layer in f32 with those values
// rounded.
struct LayerPair {
  std::unique_ptr<Layer> f64, f32;
  std::vector<Tensor> x64, x32;
  Shape out;  // batch shape of the output
};

inline LayerPair MakeLayerPair(const std::string& type, const Args& args,
                               const std::vector<Shape>& batch_shapes, double lo = -1,
                               double hi = 1, uint64_t seed = 3) {
  std::vector<Shape> samples;
  for (const Shape& s : batch_shapes) samples.push_back(s.WithoutBatch());
  const LayerType* t = LayerRegistry::Get().Find(type);
  if (t == nullptr) throw Error("no layer type " + type);
  Args a = args;
  a.FillDefaults(t->schema);
  LayerPair p;
  p.f64 = t->create(type + "0", a);
  p.f32 = t->create(type + "0", a);
  p.out = p.f64->Build(samples, DType::kF64).WithBatch(batch_shapes[0][0]);
  p.f32->Build(samples, DType::kF32);
  auto& params = p.f64->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor v = RandomTensor(params[i].value.shape(), seed + 100 + i, lo, hi);
    params[i].value = v;
    params[i].grad = Tensor::Zeros(v.shape(), DType::kF64);
    p.f32->parameters()[i].value = v.Cast(DType::kF32);
    p.f32->parameters()[i].grad = Tensor::Zeros(v.shape(), DType::kF32);
  }
  for (size_t k = 0; k < batch_shapes.size(); ++k) {
    p.x64.push_back(RandomTensor(batch_shapes[k], seed + k));
    p.x32.push_back(p.x64.back().Cast(DType::kF32));
  }
  return p;
}

// max |got - want| / max(max |want|, 1).
inline double RelError(const Tensor& got, const std::vector<double>& want) {
  EXPECT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  double diff = 0, scale = 1;
  for (int64_t i = 0; i < got.numel() && i < static_cast<int64_t>(want.size()); ++i) {
    diff = std::max(diff, std::abs(got.At(i) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / scale;
}

inline std::vector<double> Values(const Tensor& t) {
  std::vector<double> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.At(i);
  return v;
}

// The reference output of the f64 layer (its parameters) for inputs x.
using Reference =
    std::function<std::vector<double>(const std::vector<Tensor>& x, Layer& layer_f64)>;

// Forward in f64 and f32 against `ref`; backward in f32 against f64 (the
// input and parameter gradients for one random dy); then the f64 gradient
// check. Returns the f32 forward's relative error.
inline double CheckLayer(const std::string& type, const Args& args,
                         const std::vector<Shape>& batch_shapes, const Reference& ref,
                         double f32_tol = 1e-5, bool grad_check = true) {
  LayerPair p = MakeLayerPair(type, args, batch_shapes);
  const std::vector<double> want = ref(p.x64, *p.f64);
  const Tensor y64 = RunForward(*p.f64, p.x64, p.out, {});
  const Tensor y32 = RunForward(*p.f32, p.x32, p.out, {});
  EXPECT_LE(RelError(y64, want), 1e-12) << type << " f64 forward";
  const double err32 = RelError(y32, want);
  EXPECT_LE(err32, f32_tol) << type << " f32 forward";

  const Tensor dy = RandomTensor(p.out, 55);
  const Tensor dy32 = dy.Cast(DType::kF32);
  std::vector<Tensor> dx64, dx32;
  std::vector<Tensor*> d64, d32;
  std::vector<const Tensor*> in64, in32;
  for (size_t k = 0; k < p.x64.size(); ++k) {
    dx64.push_back(Tensor::Zeros(p.x64[k].shape(), DType::kF64));
    dx32.push_back(Tensor::Zeros(p.x64[k].shape(), DType::kF32));
    in64.push_back(&p.x64[k]);
    in32.push_back(&p.x32[k]);
  }
  for (size_t k = 0; k < dx64.size(); ++k) {
    d64.push_back(&dx64[k]);
    d32.push_back(&dx32[k]);
  }
  p.f64->Backward(in64, y64, dy, d64);
  p.f32->Backward(in32, y32, dy32, d32);
  for (size_t k = 0; k < dx64.size(); ++k) {
    EXPECT_LE(RelError(dx32[k], Values(dx64[k])), f32_tol) << type << " f32 dx" << k;
  }
  for (size_t i = 0; i < p.f64->parameters().size(); ++i) {
    EXPECT_LE(RelError(p.f32->parameters()[i].grad, Values(p.f64->parameters()[i].grad)), f32_tol)
        << type << " f32 gradient of parameter '" << p.f64->parameters()[i].name << "'";
  }
  if (grad_check) CheckGradients(*p.f64, p.x64, p.out);
  return err32;
}

}  // namespace cnnflow::testing
