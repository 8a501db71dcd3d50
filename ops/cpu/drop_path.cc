// CPU kernels of drop_path: one keyed draw per sample (ops/layers/drop_path.h),
// then y = x * scale[n] row by row (contiguous, vectorised), parallel over rows.
#include "ops/layers/drop_path.h"

#include <algorithm>

#include "ops/cpu/parallel.h"
#include "ops/layers/dropout.h"
#include "ops/random.h"

namespace cnnflow {
namespace {

// dst[n, :] = src[n, :] * scale[n] over rows of `per` elements.
void ScaleRows(const Tensor& src, Tensor& dst, const std::vector<double>& scale) {
  const int64_t rows = static_cast<int64_t>(scale.size());
  const int64_t per = src.numel() / std::max<int64_t>(rows, 1);
  DispatchFloat(src.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* s = src.data<T>();
    T* d = dst.data<T>();
    cpu::ParallelFor(rows, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(per, 1)),
                     [&](int64_t b, int64_t e) {
                       for (int64_t r = b; r < e; ++r) {
                         const T m = static_cast<T>(scale[r]);
                         const T* in = s + r * per;
                         T* out = d + r * per;
                         for (int64_t i = 0; i < per; ++i) out[i] = in[i] * m;
                       }
                     });
  });
}

}  // namespace

DropPathLayer::DropPathLayer(const std::string& name, const Args& args)
    : Layer(name), p_(args.Float("p")) {
  if (!(p_ >= 0.0 && p_ <= 1.0)) {
    throw ConfigError(StrCat("drop_path '", name, "': p must be in [0, 1], got ", p_));
  }
}

Shape DropPathLayer::Build(const std::vector<Shape>& inputs, DType /*dtype*/) {
  if (inputs.size() != 1) {
    throw ShapeError(StrCat("drop_path '", name(), "' takes 1 input, got ", inputs.size()));
  }
  return inputs[0];
}

bool DropPathLayer::DrawRows(int64_t n, const ForwardContext& ctx) {
  row_scale_.clear();
  if (!ctx.training || p_ == 0.0) return false;
  const uint64_t key = DropoutLayer::MaskKey(ctx, name());
  // p == 1 drops every sample (torchvision gives zeros, not NaN).
  const double scale = p_ < 1.0 ? 1.0 / (1.0 - p_) : 0.0;
  row_scale_.resize(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    const int64_t s = ctx.sample_ids != nullptr ? ctx.sample_ids[r] : r;
    row_scale_[r] = UniformAt(key, static_cast<uint64_t>(s)) >= p_ ? scale : 0.0;
  }
  return true;
}

void DropPathLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                            const ForwardContext& ctx) {
  const Tensor& in = *x[0];
  CNNFLOW_ENFORCE(in.numel() == y.numel(), "drop_path ", name(), ": ", in.shape(), " -> ",
                  y.shape());
  if (!DrawRows(in.dim(0), ctx)) {
    if (y.raw_data() != in.raw_data()) y.CopyFrom(in);
    return;
  }
  ScaleRows(in, y, row_scale_);
}

void DropPathLayer::Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& /*y*/,
                             const Tensor& dy, const std::vector<Tensor*>& dx) {
  if (dx.empty() || dx[0] == nullptr) return;
  if (row_scale_.empty()) {
    dx[0]->CopyFrom(dy);
    return;
  }
  CNNFLOW_ENFORCE(dy.dim(0) == static_cast<int64_t>(row_scale_.size()), "drop_path ", name(),
                  ": dy ", dy.shape(), " but the last forward had ", row_scale_.size(), " rows");
  ScaleRows(dy, *dx[0], row_scale_);
}

CNNFLOW_REGISTER_LAYER(
    drop_path, DropPathLayer,
    Schema("Stochastic depth (torchvision.ops.StochasticDepth, mode 'row'): in training zeroes "
           "each sample's whole tensor with probability p and scales the kept ones by 1/(1-p); "
           "the identity in evaluation. The draw depends only on the seed, the step, the layer "
           "name and the sample id (as dropout's).")
        .Optional("p", ParamType::kFloat, 0.1, "probability of dropping a sample"));

}  // namespace cnnflow
