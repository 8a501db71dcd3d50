#include "ops/layers/layer_scale.h"

#include "ops/cpu/broadcast_mul.h"

namespace cnnflow {

LayerScaleLayer::LayerScaleLayer(const std::string& name, const Args& args)
    : Layer(name), init_(args.Float("init")) {}

Shape LayerScaleLayer::Build(const std::vector<Shape>& inputs, DType dtype) {
  CNNFLOW_ENFORCE(inputs.size() == 1, "layer_scale takes 1 input, got ", inputs.size());
  const Shape& s = inputs[0];
  if (s.rank() < 1) throw ShapeError(StrCat("layer_scale expects samples [C, ...], got ", s));
  channels_ = s[0];
  positions_ = s.numel() / channels_;
  std::vector<int64_t> dims(s.rank(), 1);
  dims[0] = channels_;
  AddParameter("", Shape(dims), dtype);
  return s;
}

void LayerScaleLayer::ResetParameters(Rng& /*rng*/) {
  for (auto& p : parameters()) {
    for (int64_t i = 0; i < p.value.numel(); ++i) p.value.Set(i, init_);
  }
}

void LayerScaleLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                              const ForwardContext& /*ctx*/) {
  const Tensor& in = *x[0];
  const int64_t n = in.dim(0);
  CNNFLOW_ENFORCE(in.numel() == n * channels_ * positions_ && y.numel() == in.numel(),
                  "layer_scale ", name(), ": ", in.shape(), " -> ", y.shape());
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    cpu::BroadcastMul<T>(in.data<T>(), parameters()[0].value.data<T>(), 0, y.data<T>(), n,
                         channels_, positions_);
  });
}

void LayerScaleLayer::Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/,
                               const Tensor& dy, const std::vector<Tensor*>& dx) {
  const int64_t n = dy.dim(0);
  CNNFLOW_ENFORCE(dy.numel() == n * channels_ * positions_, "layer_scale ", name(), ": dy ",
                  dy.shape());
  Parameter& gamma = parameters()[0];
  DispatchFloat(dy.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* g = dy.data<T>();
    if (dx[0] != nullptr) {
      cpu::BroadcastMul<T>(g, gamma.value.data<T>(), 0, dx[0]->data<T>(), n, channels_, positions_);
    }
    // dgamma[c] += sum over n of (sum over positions of dy x): per-sample
    // sums first, then the batch in order, vectorised over c.
    if (!partial_.defined() || partial_.numel() < n * channels_ || partial_.dtype() != dy.dtype()) {
      partial_ = Tensor::Empty({n * channels_}, dy.dtype());
    }
    T* part = partial_.data<T>();
    cpu::RowDots<T>(g, x[0]->data<T>(), part, n * channels_, positions_);
    T* dg = gamma.grad.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      const T* pi = part + i * channels_;
      for (int64_t c = 0; c < channels_; ++c) dg[c] += pi[c];
    }
  });
}

CNNFLOW_REGISTER_LAYER(layer_scale, LayerScaleLayer,
                       Schema("Learnable per-channel scale y = gamma * x (ConvNeXt's layer "
                              "scale). gamma is [C, 1, 1] for [C, H, W] samples ([C, 1] for "
                              "[C, L]) and is named as the layer itself in the state_dict.")
                           .Optional("init", ParamType::kFloat, 1e-6, "initial value of gamma"));

}  // namespace cnnflow
