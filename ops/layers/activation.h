// The pointwise activation layers other than relu, as one class over a table
// of functions, each defined exactly as PyTorch's module of the same name:
//   gelu {approximate: none | tanh}   torch.nn.GELU: x * Phi(x) (erf), or its tanh form
//   silu          torch.nn.SiLU: x * sigmoid(x)
//   sigmoid, tanh torch.nn.Sigmoid, torch.nn.Tanh
//   hardsigmoid   torch.nn.Hardsigmoid: relu6(x + 3) / 6
//   hardswish     torch.nn.Hardswish: x * relu6(x + 3) / 6
//   relu6         torch.nn.ReLU6: min(max(x, 0), 6)
//   leaky_relu {negative_slope: 0.01}   torch.nn.LeakyReLU
// The gradients at the kinks are PyTorch's too (see each function below).
//
// The math is here, once, for the CPU loops (ops/cpu/activation.cc) and the
// CUDA functors (ops/cuda/activation.cu) alike; on the CPU, f32 gelu, silu,
// sigmoid and tanh run as oneDNN eltwise primitives instead.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/layer.h"

#ifdef __CUDACC__
#define CNNFLOW_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define CNNFLOW_HOST_DEVICE inline
#endif

namespace cnnflow {

// The function a layer computes (gelu is two: its `approximate` picks one).
enum class Activation : uint8_t {
  kGeluErf,
  kGeluTanh,
  kSilu,
  kSigmoid,
  kTanh,
  kHardsigmoid,
  kHardswish,
  kRelu6,
  kLeakyRelu,
};

// x: [N, ...] -> y: [N, ...] (same shape). Backward reads x, never y (every
// gradient is written as a function of x, as oneDNN's and PyTorch's are for
// most of these), so it works the same whether or not y is still there.
class ActivationLayer : public Layer {
 public:
  // `declared`: the registered type's function (kGeluErf for "gelu"; its
  // `approximate: tanh` makes it kGeluTanh). Bad params throw ConfigError.
  ActivationLayer(Activation declared, const std::string& name, const Args& args);

  const char* type() const override;
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  // Elementwise: works in either layout.
  ChannelsLast ChannelsLastSupport() const override { return ChannelsLast::kFollows; }

  Activation kind() const { return kind_; }
  // leaky_relu's negative_slope (0 for the others): the `a` of the functions.
  double alpha() const { return alpha_; }

 protected:
  // The checks shared with the CUDA class: one input, same numel.
  void CheckForward(const Tensor& x, const Tensor& y) const;
  void CheckBackward(const Tensor& x, const Tensor& dy, const Tensor& dx) const;

 private:
  Activation kind_;
  double alpha_ = 0;
};

// The functions: Forward(x, a) = y and Backward(x, g, a) = g * dy/dx, in T
// (double on the CPU's reference path, float otherwise). `a` is
// leaky_relu's slope; the others ignore it.
namespace act {

using std::erf;
using std::exp;
using std::tanh;

struct GeluErf {
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Forward(T x, T) {
    return T(0.5) * x * (T(1) + erf(x * T(0.70710678118654752440)));
  }
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Backward(T x, T g, T) {
    const T cdf = T(0.5) * (T(1) + erf(x * T(0.70710678118654752440)));
    const T pdf = exp(T(-0.5) * x * x) * T(0.39894228040143267794);  // 1/sqrt(2 pi)
    return g * (cdf + x * pdf);
  }
};

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as torch's approximate="tanh".
struct GeluTanh {
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Forward(T x, T) {
    return T(0.5) * x * (T(1) + tanh(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x)));
  }
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Backward(T x, T g, T) {
    const T t = tanh(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x));
    const T du = T(0.79788456080286535588) * (T(1) + T(3 * 0.044715) * x * x);
    return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du);
  }
};

struct Sigmoid {
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Forward(T x, T) {
    return T(1) / (T(1) + exp(-x));
  }
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Backward(T x, T g, T) {
    const T s = Forward(x, T(0));
    return g * s * (T(1) - s);
  }
};

struct Silu {
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Forward(T x, T) {
    return x * Sigmoid::Forward(x, T(0));
  }
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Backward(T x, T g, T) {
    const T s = Sigmoid::Forward(x, T(0));
    return g * s * (T(1) + x * (T(1) - s));
  }
};

struct Tanh {
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Forward(T x, T) {
    return tanh(x);
  }
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Backward(T x, T g, T) {
    const T t = tanh(x);
    return g * (T(1) - t * t);
  }
};

// min(max(x, lo), hi) with NaN passed through, as torch.clamp.
template <typename T>
CNNFLOW_HOST_DEVICE T Clamp(T x, T lo, T hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// Gradient 1/6 strictly inside (-3, 3), else 0 (torch's hardsigmoid_backward).
struct Hardsigmoid {
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Forward(T x, T) {
    return Clamp(x + T(3), T(0), T(6)) * T(1.0 / 6);
  }
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Backward(T x, T g, T) {
    return x > T(-3) && x < T(3) ? g * T(1.0 / 6) : T(0);
  }
};

// Gradient 0 for x <= -3, x/3 + 1/2 for -3 < x < 3, 1 for x >= 3: what
// torch 2.15's hardswish_backward gives at the kinks (measured: 0 at -3, 1
// at 3, on CPU in f32 and f64; older releases took [-3, 3] closed).
struct Hardswish {
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Forward(T x, T) {
    return x * Clamp(x + T(3), T(0), T(6)) * T(1.0 / 6);
  }
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Backward(T x, T g, T) {
    return x <= T(-3) ? T(0) : (x < T(3) ? g * (x * T(1.0 / 3) + T(0.5)) : g);
  }
};

// Gradient 0 at and outside the kinks 0 and 6 (torch's hardtanh_backward).
struct Relu6 {
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Forward(T x, T) {
    return Clamp(x, T(0), T(6));
  }
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Backward(T x, T g, T) {
    return x > T(0) && x < T(6) ? g : T(0);
  }
};

// Gradient `a` at 0 (torch: x > 0 ? g : g * a).
struct LeakyRelu {
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Forward(T x, T a) {
    return x > T(0) ? x : x * a;
  }
  template <typename T>
  CNNFLOW_HOST_DEVICE static T Backward(T x, T g, T a) {
    return x > T(0) ? g : g * a;
  }
};

}  // namespace act

// fn(act::Op{}) for the function `k` (host code: the one switch over kinds).
template <typename Fn>
decltype(auto) VisitActivation(Activation k, Fn&& fn) {
  switch (k) {
    case Activation::kGeluErf:
      return fn(act::GeluErf{});
    case Activation::kGeluTanh:
      return fn(act::GeluTanh{});
    case Activation::kSilu:
      return fn(act::Silu{});
    case Activation::kSigmoid:
      return fn(act::Sigmoid{});
    case Activation::kTanh:
      return fn(act::Tanh{});
    case Activation::kHardsigmoid:
      return fn(act::Hardsigmoid{});
    case Activation::kHardswish:
      return fn(act::Hardswish{});
    case Activation::kRelu6:
      return fn(act::Relu6{});
    case Activation::kLeakyRelu:
      break;
  }
  return fn(act::LeakyRelu{});
}

}  // namespace cnnflow
