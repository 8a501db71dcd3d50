// layernorm on the CPU. The statistics of position p reduce over the C
// channels, which lie P apart; so the loops run over channels outside and
// over a block of contiguous positions inside (vectorised), keeping one
// running sum per position. A task is (sample, block of positions): each
// statistic is computed by one task in channel order, so the result does
// not depend on the thread count. Backward's weight and bias gradients are
// summed per task, then over the tasks in order.
//
// A batch of [C] samples (P = 1) would leave nothing to vectorise over: it
// is transposed to [C, N] and runs as one sample whose positions are the
// batch's rows.
#include "ops/layers/layer_norm.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/elementwise.h"
#include "ops/cpu/parallel.h"

namespace cnnflow {

namespace {

// Positions per task: a block's running sums stay in L1.
constexpr int64_t kBlock = 256;
constexpr int64_t kGrain = int64_t{1} << 15;  // elements per parallel task

// dst[c, r] = src[r, c] for src [rows, cols].
template <typename T>
void Transpose(const T* src, T* dst, int64_t rows, int64_t cols) {
  cpu::ParallelFor(cols, std::max<int64_t>(1, kGrain / std::max<int64_t>(rows, 1)),
                   [&](int64_t b, int64_t e) {
                     for (int64_t c = b; c < e; ++c) {
                       for (int64_t r = 0; r < rows; ++r) dst[c * rows + r] = src[r * cols + c];
                     }
                   });
}

// A sample as C rows of P positions; a task's positions [p0, p0 + len).
struct Plane {
  int64_t c, p, p0, len;
  int64_t at(int64_t ch) const { return ch * p + p0; }
};

// y and this block's mean and rstd (mu, rs: len values each).
template <typename T>
void ForwardBlock(const Plane& v, const T* x, T* y, const T* w, const T* b, T eps, T* mu, T* rs) {
  const T inv_c = T(1) / static_cast<T>(v.c);
  std::fill(mu, mu + v.len, T(0));
  std::fill(rs, rs + v.len, T(0));
  for (int64_t c = 0; c < v.c; ++c) {
    const T* xc = x + v.at(c);
    for (int64_t j = 0; j < v.len; ++j) mu[j] += xc[j];
  }
  for (int64_t j = 0; j < v.len; ++j) mu[j] *= inv_c;
  for (int64_t c = 0; c < v.c; ++c) {  // two passes: no cancellation in the variance
    const T* xc = x + v.at(c);
    for (int64_t j = 0; j < v.len; ++j) {
      const T d = xc[j] - mu[j];
      rs[j] += d * d;
    }
  }
  for (int64_t j = 0; j < v.len; ++j) rs[j] = T(1) / std::sqrt(rs[j] * inv_c + eps);
  for (int64_t c = 0; c < v.c; ++c) {
    const T* xc = x + v.at(c);
    T* yc = y + v.at(c);
    const T wc = w != nullptr ? w[c] : T(1), bc = b != nullptr ? b[c] : T(0);
    for (int64_t j = 0; j < v.len; ++j) yc[j] = (xc[j] - mu[j]) * rs[j] * wc + bc;
  }
}

// With xhat = (x - mu) * rs and g = dy * w[c]:
//   dx = rs * (g - mean_c(g) - xhat * mean_c(g * xhat)),
//   pdw[c] = sum over the block of dy * xhat, pdb[c] = sum of dy.
template <typename T>
void BackwardBlock(const Plane& v, const T* x, const T* dy, T* dx, const T* w, const T* mu,
                   const T* rs, T* pdw, T* pdb) {
  T s1[kBlock] = {}, s2[kBlock] = {}, t[kBlock];
  for (int64_t c = 0; c < v.c; ++c) {
    const T* xc = x + v.at(c);
    const T* gc = dy + v.at(c);
    const T wc = w != nullptr ? w[c] : T(1);
    for (int64_t j = 0; j < v.len; ++j) {
      t[j] = gc[j] * ((xc[j] - mu[j]) * rs[j]);
      s1[j] += gc[j] * wc;
      s2[j] += t[j] * wc;
    }
    pdw[c] = RowSum(t, v.len);
    pdb[c] = RowSum(gc, v.len);
  }
  if (dx == nullptr) return;
  const T inv_c = T(1) / static_cast<T>(v.c);
  for (int64_t c = 0; c < v.c; ++c) {
    const T* xc = x + v.at(c);
    const T* gc = dy + v.at(c);
    T* dc = dx + v.at(c);
    const T wc = w != nullptr ? w[c] : T(1);
    for (int64_t j = 0; j < v.len; ++j) {
      const T xhat = (xc[j] - mu[j]) * rs[j];
      dc[j] = rs[j] * (gc[j] * wc - (s1[j] + xhat * s2[j]) * inv_c);
    }
  }
}

// The work split: `samples` planes of c x p (the batch, or one transposed
// [C, N] plane), cut into blocks of positions; fn(task, sample, plane).
struct Split {
  int64_t samples, c, p, blocks;
  Split(int64_t n, int64_t channels, int64_t positions, bool transposed)
      : samples(transposed ? 1 : n),
        c(channels),
        p(transposed ? n : positions),
        blocks((p + kBlock - 1) / kBlock) {}
  int64_t tasks() const { return samples * blocks; }
  template <typename Fn>
  void Run(Fn&& fn) const {
    const int64_t per_task = c * std::min(p, kBlock);
    cpu::ParallelFor(tasks(), std::max<int64_t>(1, kGrain / std::max<int64_t>(per_task, 1)),
                     [&](int64_t b, int64_t e) {
                       for (int64_t t = b; t < e; ++t) {
                         const int64_t s = t / blocks, p0 = (t % blocks) * kBlock;
                         fn(t, s, Plane{c, p, p0, std::min(kBlock, p - p0)});
                       }
                     });
  }
};

}  // namespace

LayerNormLayer::LayerNormLayer(const std::string& name, const Args& args)
    : ChannelNormLayer(name, args, "layernorm") {}

Shape LayerNormLayer::Build(const std::vector<Shape>& inputs, DType dtype) {
  CNNFLOW_ENFORCE(inputs.size() == 1, "layernorm takes 1 input, got ", inputs.size());
  const Shape& s = inputs[0];
  if (s.rank() < 1 || s[0] < 1) {
    throw ShapeError(StrCat("layernorm expects samples [C], [C, L] or [C, H, W], got ", s));
  }
  BuildChannels(s, dtype);
  return s;
}

void LayerNormLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                             const ForwardContext& /*ctx*/) {
  const Tensor& in = *x[0];
  const int64_t n = in.dim(0), per = channels_ * positions_;
  CNNFLOW_ENFORCE(in.numel() == n * per && y.numel() == in.numel(), "layernorm ", name(), ": ",
                  in.shape(), " -> ", y.shape());
  if (!mean_.defined() || mean_.numel() != n * positions_ || mean_.dtype() != in.dtype()) {
    mean_ = Tensor::Empty({n * positions_}, in.dtype());
    rstd_ = Tensor::Empty({n * positions_}, in.dtype());
  }
  const bool transposed = positions_ == 1 && n > 1;
  const Split split(n, channels_, positions_, transposed);
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    T* ys = y.data<T>();
    if (transposed) {
      if (!scratch_.defined() || scratch_.dtype() != in.dtype() || scratch_.numel() < 2 * n * per) {
        scratch_ = Tensor::Empty({2 * n * per}, in.dtype());
      }
      T* xt = scratch_.data<T>();
      Transpose(xs, xt, n, channels_);
      xs = xt;
      ys = xt + n * per;
    }
    const T* w = affine_ ? parameters()[0].value.data<T>() : nullptr;
    const T* b = affine_ ? parameters()[1].value.data<T>() : nullptr;
    T* mu = mean_.data<T>();
    T* rs = rstd_.data<T>();
    const int64_t plane = split.c * split.p;
    split.Run([&](int64_t, int64_t s, const Plane& v) {
      const int64_t o = s * split.p + v.p0;
      ForwardBlock<T>(v, xs + s * plane, ys + s * plane, w, b, static_cast<T>(eps_), mu + o,
                      rs + o);
    });
    if (transposed) Transpose(ys, y.data<T>(), channels_, n);
  });
}

void LayerNormLayer::Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/,
                              const Tensor& dy, const std::vector<Tensor*>& dx) {
  const Tensor& in = *x[0];
  const int64_t n = in.dim(0), per = channels_ * positions_;
  CNNFLOW_ENFORCE(dy.numel() == n * per && mean_.defined() && mean_.numel() == n * positions_,
                  "layernorm ", name(), ": dy ", dy.shape(), " without a forward of its shape");
  const bool transposed = positions_ == 1 && n > 1;
  const Split split(n, channels_, positions_, transposed);
  const int64_t part = 2 * channels_;  // a task's dw then db
  const int64_t need = split.tasks() * part + (transposed ? 3 * n * per : 0);
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (!scratch_.defined() || scratch_.dtype() != in.dtype() || scratch_.numel() < need) {
      scratch_ = Tensor::Empty({need}, in.dtype());
    }
    T* partial = scratch_.data<T>();
    const T* xs = in.data<T>();
    const T* g = dy.data<T>();
    T* d = dx[0] != nullptr ? dx[0]->data<T>() : nullptr;
    if (transposed) {
      T* xt = partial + split.tasks() * part;
      Transpose(xs, xt, n, channels_);
      Transpose(g, xt + n * per, n, channels_);
      xs = xt;
      g = xt + n * per;
      if (d != nullptr) d = xt + 2 * n * per;
    }
    const T* w = affine_ ? parameters()[0].value.data<T>() : nullptr;
    const T* mu = mean_.data<T>();
    const T* rs = rstd_.data<T>();
    const int64_t plane = split.c * split.p;
    split.Run([&](int64_t t, int64_t s, const Plane& v) {
      const int64_t o = s * split.p + v.p0;
      T* pt = partial + t * part;
      BackwardBlock<T>(v, xs + s * plane, g + s * plane, d != nullptr ? d + s * plane : nullptr, w,
                       mu + o, rs + o, pt, pt + channels_);
    });
    if (transposed && d != nullptr) Transpose(d, dx[0]->data<T>(), channels_, n);
    if (!affine_) return;
    T* dw = parameters()[0].grad.data<T>();
    T* db = parameters()[1].grad.data<T>();
    for (int64_t t = 0; t < split.tasks(); ++t) {  // in task order: deterministic
      const T* pt = partial + t * part;
      for (int64_t c = 0; c < channels_; ++c) dw[c] += pt[c];
      for (int64_t c = 0; c < channels_; ++c) db[c] += pt[channels_ + c];
    }
  });
}

CNNFLOW_REGISTER_LAYER(layernorm, LayerNormLayer,
                       Schema("Layer normalisation over the channels at each position of [C, H, "
                              "W] or [C, L] samples (ConvNeXt's LayerNorm2d), or of a [C] sample "
                              "(nn.LayerNorm(C)): biased variance, then weight[c] and bias[c].")
                           .Optional("eps", ParamType::kFloat, 1e-6, "added to the variance")
                           .Optional("affine", ParamType::kBool, true,
                                     "learn a per-channel weight (1) and bias (0)"));

}  // namespace cnnflow
