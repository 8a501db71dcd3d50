#include "ops/layers/mul.h"

#include "ops/cpu/broadcast_mul.h"

namespace cnnflow {

MulLayer::MulLayer(const std::string& name, const Args& args) : Layer(name) {
  const std::vector<double> scale = args.Floats("scale");
  if (scale.size() > 1) {
    throw ConfigError(StrCat("mul '", name, "': scale is one number, got ", scale.size()));
  }
  has_scale_ = !scale.empty();
  if (has_scale_) scale_ = scale[0];
}

Shape MulLayer::Build(const std::vector<Shape>& inputs, DType /*dtype*/) {
  const size_t want = has_scale_ ? 1 : 2;
  if (inputs.size() != want) {
    throw ShapeError(StrCat("mul takes ", want, " input(s) ",
                            has_scale_ ? "with a scale" : "without a scale", ", got ",
                            inputs.size()));
  }
  const Shape& x = inputs[0];
  if (has_scale_) {
    factors_ = 1;
    repeat_ = x.numel();
    return x;
  }
  const Shape& s = inputs[1];
  // s without its trailing ones must be a leading part of x's shape.
  int core = s.rank();
  while (core > 0 && s[core - 1] == 1) --core;
  bool fits = s.rank() <= x.rank();
  for (int d = 0; fits && d < core; ++d) fits = s[d] == x[d];
  if (!fits) {
    throw ShapeError(
        StrCat("mul multiplies x by s of x's shape or broadcast over x's trailing "
               "dimensions (x [C, H, W] by s [C, 1, 1], [C, 1] or [C]); got x ",
               x, " and s ", s));
  }
  factors_ = s.numel();
  repeat_ = x.numel() / factors_;
  return x;
}

void MulLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                       const ForwardContext& /*ctx*/) {
  const Tensor& in = *x[0];
  const int64_t n = in.dim(0);
  CNNFLOW_ENFORCE(in.numel() == n * factors_ * repeat_ && y.numel() == in.numel(), "mul ", name(),
                  ": ", in.shape(), " -> ", y.shape());
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (has_scale_) {
      const T a = static_cast<T>(scale_);
      cpu::BroadcastMul<T>(in.data<T>(), &a, 0, y.data<T>(), n, 1, repeat_);
      return;
    }
    const Tensor& s = *x[1];
    CNNFLOW_ENFORCE(s.numel() == n * factors_, "mul ", name(), ": s ", s.shape(), " for x ",
                    in.shape());
    cpu::BroadcastMul<T>(in.data<T>(), s.data<T>(), factors_, y.data<T>(), n, factors_, repeat_);
  });
}

void MulLayer::Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/, const Tensor& dy,
                        const std::vector<Tensor*>& dx) {
  const int64_t n = dy.dim(0);
  DispatchFloat(dy.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* g = dy.data<T>();
    if (has_scale_) {
      const T a = static_cast<T>(scale_);
      if (dx[0] != nullptr) cpu::BroadcastMul<T>(g, &a, 0, dx[0]->data<T>(), n, 1, repeat_);
      return;
    }
    const T* s = x[1]->data<T>();
    if (dx[1] != nullptr) {  // ds[n, m] = sum over r of dy[n, m, r] x[n, m, r]
      cpu::RowDots<T>(g, x[0]->data<T>(), dx[1]->data<T>(), n * factors_, repeat_);
    }
    if (dx[0] != nullptr) {
      cpu::BroadcastMul<T>(g, s, factors_, dx[0]->data<T>(), n, factors_, repeat_);
    }
  });
}

CNNFLOW_REGISTER_LAYER(
    mul, MulLayer,
    Schema("Elementwise product. Without scale: y = x * s of two inputs `inputs: [x, s]`, s of "
           "x's shape or broadcast over x's trailing dimensions (s [C, 1, 1], [C, 1] or [C] "
           "times x [C, H, W]: dimensions align from the channel end). With scale: y = scale * x "
           "of one input.")
        .Optional("scale", ParamType::kFloatList, std::vector<double>{},
                  "a constant factor (one number); given, the layer takes one input"));

}  // namespace cnnflow
