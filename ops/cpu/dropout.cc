#include "ops/layers/dropout.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/parallel.h"
#include "ops/random.h"

namespace cnnflow {

namespace {

constexpr int64_t kGrain = int64_t{1} << 14;

// FNV-1a: a fixed hash, so masks are the same across compilers and runs.
uint64_t HashName(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// y[i] = x[i] * m[i], m[i] = scale if draw (first + i) is kept else 0, for i
// in [b, e). A function of plain values (no captured references that the
// stores might alias), so the loop vectorises.
template <typename T>
void DropoutKernel(const T* x, T* m, T* y, int64_t b, int64_t e, uint64_t key, uint64_t threshold,
                   T scale, int64_t first = 0) {
  for (int64_t i = b; i < e; ++i) {
    const uint64_t bits = Mix64(key ^ Mix64(static_cast<uint64_t>(first + i))) >> 11;
    const T mi = bits >= threshold ? scale : T(0);
    m[i] = mi;
    y[i] = x[i] * mi;
  }
}

}  // namespace

uint64_t DropoutLayer::MaskKey(const ForwardContext& ctx, const std::string& layer_name) {
  return StreamKey(ctx.seed, static_cast<uint64_t>(ctx.step), HashName(layer_name));
}

DropoutLayer::DropoutLayer(const std::string& name, const Args& args)
    : Layer(name), p_(args.Float("p")) {
  if (!(p_ >= 0.0 && p_ <= 1.0)) {
    throw ConfigError(StrCat("dropout '", name, "': p must be in [0, 1], got ", p_));
  }
}

Shape DropoutLayer::Build(const std::vector<Shape>& inputs, DType /*dtype*/) {
  CNNFLOW_ENFORCE(inputs.size() == 1, "dropout takes 1 input, got ", inputs.size());
  return inputs[0];
}

void DropoutLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                           const ForwardContext& ctx) {
  const Tensor& in = *x[0];
  CNNFLOW_ENFORCE(in.numel() == y.numel(), "dropout ", name(), ": ", in.shape(), " -> ", y.shape());
  last_training_ = ctx.training && p_ > 0.0;
  if (!last_training_) {
    if (y.raw_data() != in.raw_data()) y.CopyFrom(in);
    return;
  }
  if (!mask_.defined() || mask_.shape() != in.shape() || mask_.dtype() != in.dtype()) {
    mask_ = Tensor::Empty(in.shape(), in.dtype());
  }
  const uint64_t key = MaskKey(ctx, name());
  // UniformAt(key, i) = (bits >> 11) * 2^-53 >= p  <=>  (bits >> 11) >= ceil(p * 2^53)
  // (exact: both sides are integers below 2^53 scaled by a power of two), so
  // the loop stays in integers and vectorises.
  const uint64_t threshold = static_cast<uint64_t>(std::ceil(p_ * 0x1.0p53));
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    // p == 1 drops everything (PyTorch gives zeros, not NaN).
    const T scale = p_ < 1.0 ? static_cast<T>(1.0 / (1.0 - p_)) : T(0);
    const T* xs = in.data<T>();
    T* m = mask_.data<T>();
    T* ys = y.data<T>();
    // Element i's draw depends on i (or its sample id) alone, so any split
    // gives the same mask.
    if (ctx.sample_ids == nullptr) {
      cpu::ParallelFor(in.numel(), kGrain, [&](int64_t b, int64_t e) {
        DropoutKernel<T>(xs, m, ys, b, e, key, threshold, scale);
      });
      return;
    }
    const int64_t rows = in.dim(0), per = in.numel() / std::max<int64_t>(rows, 1);
    cpu::ParallelFor(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(per, 1)),
                     [&](int64_t b, int64_t e) {
                       for (int64_t n = b; n < e; ++n) {
                         const int64_t o = n * per;
                         DropoutKernel<T>(xs + o, m + o, ys + o, 0, per, key, threshold, scale,
                                          ctx.sample_ids[n] * per);
                       }
                     });
  });
}

void DropoutLayer::Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& /*y*/,
                            const Tensor& dy, const std::vector<Tensor*>& dx) {
  if (dx[0] == nullptr) return;
  if (!last_training_) {
    dx[0]->CopyFrom(dy);
    return;
  }
  CNNFLOW_ENFORCE(dy.shape() == mask_.shape(), "dropout ", name(), ": dy ", dy.shape(),
                  " but the last forward was ", mask_.shape());
  DispatchFloat(dy.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* m = mask_.data<T>();
    const T* g = dy.data<T>();
    T* d = dx[0]->data<T>();
    cpu::ParallelFor(dy.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) d[i] = g[i] * m[i];
    });
  });
}

CNNFLOW_REGISTER_LAYER(dropout, DropoutLayer,
                       Schema("Inverted dropout (torch.nn.Dropout): in training zeroes each "
                              "element with probability p and scales the rest by 1/(1-p); "
                              "the identity in evaluation. The mask depends only on the seed, "
                              "the step, the layer name, the sample and the element.")
                           .Optional("p", ParamType::kFloat, 0.5, "probability of zeroing"));

}  // namespace cnnflow
