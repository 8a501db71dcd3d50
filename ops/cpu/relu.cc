#include "ops/layers/relu.h"

#include "ops/cpu/parallel.h"

namespace cnnflow {

namespace {
// Elements per parallel task: large enough that scheduling is noise.
constexpr int64_t kGrain = int64_t{1} << 15;
}  // namespace

ReluLayer::ReluLayer(const std::string& name, const Args& /*args*/) : Layer(name) {}

Shape ReluLayer::Build(const std::vector<Shape>& inputs, DType /*dtype*/) {
  CNNFLOW_ENFORCE(inputs.size() == 1, "relu takes 1 input, got ", inputs.size());
  return inputs[0];
}

void ReluLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                        const ForwardContext& /*ctx*/) {
  const Tensor& in = *x[0];
  CNNFLOW_ENFORCE(in.numel() == y.numel(), "relu ", name(), ": ", in.shape(), " -> ", y.shape());
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    T* ys = y.data<T>();
    cpu::ParallelFor(in.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ys[i] = xs[i] > T(0) ? xs[i] : T(0);
    });
  });
}

void ReluLayer::Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& y, const Tensor& dy,
                         const std::vector<Tensor*>& dx) {
  if (dx[0] == nullptr) return;
  CNNFLOW_ENFORCE(dy.numel() == y.numel() && dx[0]->numel() == y.numel(), "relu ", name(), ": dy ",
                  dy.shape(), " y ", y.shape());
  DispatchFloat(y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* ys = y.data<T>();
    const T* g = dy.data<T>();
    T* d = dx[0]->data<T>();
    cpu::ParallelFor(y.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        // Both loads unconditional: a conditional load of g[i] blocks vectorisation.
        const T gv = g[i];
        d[i] = ys[i] > T(0) ? gv : T(0);
      }
    });
  });
}

CNNFLOW_REGISTER_LAYER(relu, ReluLayer, Schema("Rectified linear unit y = max(x, 0)."));

}  // namespace cnnflow
