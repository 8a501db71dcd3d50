#include "ops/layers/add.h"

#include <algorithm>

#include "ops/cpu/elementwise.h"
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
      if (relu_) {
        for (int64_t i = s; i < e; ++i) {
          const T v = as[i] + bs[i];
          ys[i] = v > T(0) ? v : T(0);
        }
        return;
      }
      for (int64_t i = s; i < e; ++i) ys[i] = as[i] + bs[i];
    });
  });
}

void AddLayer::Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& y, const Tensor& dy,
                        const std::vector<Tensor*>& dx) {
  if (!relu_) {
    for (Tensor* d : dx) {
      if (d != nullptr) d->CopyFrom(dy);
    }
    return;
  }
  // Through the fused ReLU: both inputs get dy masked by y > 0, in one pass.
  Tensor* d0 = dx[0] != nullptr ? dx[0] : dx[1];
  Tensor* d1 = dx[0] != nullptr ? dx[1] : nullptr;
  if (d0 == nullptr) return;
  DispatchFloat(y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* ys = y.data<T>();
    const T* g = dy.data<T>();
    T* o0 = d0->data<T>();
    T* o1 = d1 != nullptr ? d1->data<T>() : nullptr;
    cpu::ParallelFor(y.numel(), kGrain, [&](int64_t s, int64_t e) {
      ReluMask(ys + s, g + s, o0 + s, e - s);
      if (o1 != nullptr) std::copy(o0 + s, o0 + e, o1 + s);
    });
  });
}

CNNFLOW_REGISTER_LAYER(add, AddLayer,
                       Schema("Elementwise sum of two inputs of the same shape (a residual "
                              "join); name them with `inputs: [a, b]`."));

}  // namespace cnnflow
