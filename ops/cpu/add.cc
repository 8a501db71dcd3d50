#include "ops/add.h"

#include "ops/cpu/parallel.h"

namespace cnnflow {

namespace {
constexpr int64_t kGrain = int64_t{1} << 15;
}  // namespace

AddLayer::AddLayer(const std::string& name, const Args& /*args*/) : Layer(name) {}

Shape AddLayer::Build(const std::vector<Shape>& inputs, DType /*dtype*/) {
  if (inputs.size() != 2) throw ShapeError(StrCat("add takes 2 inputs, got ", inputs.size()));
  if (inputs[0] != inputs[1]) {
    throw ShapeError(
        StrCat("inputs must have the same shape, got ", inputs[0], " and ", inputs[1]));
  }
  return inputs[0];
}

void AddLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                       const ForwardContext& /*ctx*/) {
  const Tensor& a = *x[0];
  const Tensor& b = *x[1];
  CNNFLOW_ENFORCE(a.shape() == b.shape() && a.numel() == y.numel(), "add ", name(), ": ", a.shape(),
                  " + ", b.shape(), " -> ", y.shape());
  DispatchFloat(a.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* as = a.data<T>();
    const T* bs = b.data<T>();
    T* ys = y.data<T>();
    cpu::ParallelFor(a.numel(), kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) ys[i] = as[i] + bs[i];
    });
  });
}

void AddLayer::Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& /*y*/,
                        const Tensor& dy, const std::vector<Tensor*>& dx) {
  for (Tensor* d : dx) {
    if (d != nullptr) d->CopyFrom(dy);
  }
}

CNNFLOW_REGISTER_LAYER(add, AddLayer,
                       Schema("Elementwise sum of two inputs of the same shape (a residual "
                              "join); name them with `inputs: [a, b]`."));

}  // namespace cnnflow
