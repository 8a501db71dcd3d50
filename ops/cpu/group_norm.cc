// groupnorm on the CPU. A group of a sample is one contiguous span of
// M = C/G x P values, so its statistics are lane-vectorised row sums
// (ops/cpu/elementwise.h), two passes for the variance. One task per
// (sample, group): each sum is taken by one task in a fixed order, so the
// result does not depend on the thread count.
//
// Backward (as PyTorch's): per (sample, channel) ds = sum_p dy x and
// db = sum_p dy; from them, per group, the two sums of the normalisation's
// gradient, and dx = a_c dy + b x + d elementwise. The weight and bias
// gradients are those per-sample sums, added over the batch in order.
#include "ops/layers/group_norm.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/elementwise.h"
#include "ops/cpu/parallel.h"

namespace cnnflow {

namespace {
constexpr int64_t kGrain = int64_t{1} << 15;  // elements per parallel task
}  // namespace

GroupNormLayer::GroupNormLayer(const std::string& name, const Args& args)
    : ChannelNormLayer(name, args, "groupnorm"), groups_(args.Int("groups")) {
  if (groups_ < 1) {
    throw ConfigError(StrCat("groupnorm '", name, "': groups must be >= 1, got ", groups_));
  }
}

Shape GroupNormLayer::Build(const std::vector<Shape>& inputs, DType dtype) {
  CNNFLOW_ENFORCE(inputs.size() == 1, "groupnorm takes 1 input, got ", inputs.size());
  const Shape& s = inputs[0];
  if (s.rank() < 1 || s[0] % groups_ != 0) {
    throw ShapeError(StrCat("groupnorm with ", groups_,
                            " groups expects samples [C, ...] with C divisible by ", groups_,
                            ", got ", s));
  }
  BuildChannels(s, dtype);
  return s;
}

void GroupNormLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                             const ForwardContext& /*ctx*/) {
  const Tensor& in = *x[0];
  const int64_t n = in.dim(0), cg = channels_ / groups_, m = cg * positions_;
  CNNFLOW_ENFORCE(in.numel() == n * channels_ * positions_ && y.numel() == in.numel(), "groupnorm ",
                  name(), ": ", in.shape(), " -> ", y.shape());
  if (!mean_.defined() || mean_.numel() != n * groups_ || mean_.dtype() != in.dtype()) {
    mean_ = Tensor::Empty({n * groups_}, in.dtype());
    rstd_ = Tensor::Empty({n * groups_}, in.dtype());
  }
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    T* ys = y.data<T>();
    const T* w = affine_ ? parameters()[0].value.data<T>() : nullptr;
    const T* b = affine_ ? parameters()[1].value.data<T>() : nullptr;
    T* mu = mean_.data<T>();
    T* rs = rstd_.data<T>();
    cpu::ParallelFor(n * groups_, std::max<int64_t>(1, kGrain / m), [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {  // t = sample * G + group
        const T* xg = xs + t * m;
        T* yg = ys + t * m;
        const T mean = RowSum(xg, m) / static_cast<T>(m);
        const T r = T(1) / std::sqrt(RowSquaredDeviation(xg, m, mean) / static_cast<T>(m) +
                                     static_cast<T>(eps_));
        mu[t] = mean;
        rs[t] = r;
        for (int64_t k = 0; k < cg; ++k) {
          const int64_t c = (t % groups_) * cg + k;
          const T a = w != nullptr ? w[c] * r : r;
          const T shift = (b != nullptr ? b[c] : T(0)) - mean * a;
          const T* xc = xg + k * positions_;
          T* yc = yg + k * positions_;
          for (int64_t p = 0; p < positions_; ++p) yc[p] = xc[p] * a + shift;
        }
      }
    });
  });
}

void GroupNormLayer::Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/,
                              const Tensor& dy, const std::vector<Tensor*>& dx) {
  const Tensor& in = *x[0];
  const int64_t n = in.dim(0), cg = channels_ / groups_, m = cg * positions_;
  CNNFLOW_ENFORCE(
      dy.numel() == n * channels_ * positions_ && mean_.defined() && mean_.numel() == n * groups_,
      "groupnorm ", name(), ": dy ", dy.shape(), " without a forward of its shape");
  if (!partial_.defined() || partial_.dtype() != in.dtype() ||
      partial_.numel() < 2 * n * channels_) {
    partial_ = Tensor::Empty({2 * n * channels_}, in.dtype());
  }
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    const T* g = dy.data<T>();
    T* d = dx[0] != nullptr ? dx[0]->data<T>() : nullptr;
    const T* w = affine_ ? parameters()[0].value.data<T>() : nullptr;
    const T* mu = mean_.data<T>();
    const T* rs = rstd_.data<T>();
    T* ds = partial_.data<T>();   // [N, C]: sum_p dy x
    T* dbs = ds + n * channels_;  // [N, C]: sum_p dy
    const T inv_m = T(1) / static_cast<T>(m);
    cpu::ParallelFor(n * groups_, std::max<int64_t>(1, kGrain / m), [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t c0 = (t % groups_) * cg;  // first channel of the group
        const T mean = mu[t], r = rs[t];
        T sum_g = 0, sum_gx = 0;  // sums over the group of dy w and dy w xhat
        for (int64_t k = 0; k < cg; ++k) {
          const int64_t at = t * m + k * positions_;
          const T s1 = RowDot(g + at, xs + at, positions_), s0 = RowSum(g + at, positions_);
          ds[t * cg + k] = s1;
          dbs[t * cg + k] = s0;
          const T wc = w != nullptr ? w[c0 + k] : T(1);
          sum_g += wc * s0;
          sum_gx += wc * (s1 - mean * s0) * r;
        }
        if (d == nullptr) continue;
        // dx = r (dy w - (sum_g + xhat sum_gx) / M), xhat = (x - mean) r.
        const T bx = -r * r * sum_gx * inv_m;
        const T shift = -r * sum_g * inv_m - mean * bx;
        for (int64_t k = 0; k < cg; ++k) {
          const int64_t at = t * m + k * positions_;
          const T a = r * (w != nullptr ? w[c0 + k] : T(1));
          const T* gc = g + at;
          const T* xc = xs + at;
          T* dc = d + at;
          for (int64_t p = 0; p < positions_; ++p) dc[p] = a * gc[p] + bx * xc[p] + shift;
        }
      }
    });
    if (!affine_) return;
    // dw[c] += sum_n (ds - mean db) rstd, db[c] += sum_n db: the batch in order.
    T* dw = parameters()[0].grad.data<T>();
    T* db = parameters()[1].grad.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t c = 0; c < channels_; ++c) {
        const int64_t t = i * groups_ + c / cg;
        dw[c] += (ds[i * channels_ + c] - mu[t] * dbs[i * channels_ + c]) * rs[t];
        db[c] += dbs[i * channels_ + c];
      }
    }
  });
}

CNNFLOW_REGISTER_LAYER(groupnorm, GroupNormLayer,
                       Schema("Group normalisation (torch.nn.GroupNorm): each of `groups` groups "
                              "of channels is normalised by its own mean and biased variance "
                              "over its channels and positions, then weight[c] and bias[c].")
                           .Required("groups", ParamType::kInt, "number of groups; divides C")
                           .Optional("eps", ParamType::kFloat, 1e-5, "added to the variance")
                           .Optional("affine", ParamType::kBool, true,
                                     "learn a per-channel weight (1) and bias (0)"));

}  // namespace cnnflow
