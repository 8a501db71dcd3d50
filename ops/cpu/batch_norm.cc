#include "ops/layers/batch_norm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/cpu/bf16_layout.h"
#include "ops/cpu/gelu_vector.h"
#include "ops/cpu/onednn.h"
#include "ops/cpu/parallel.h"
#include "ops/layers/activation.h"

namespace cnnflow {

namespace {

// The per-channel sums, in double over 8 independent lanes: lane k takes
// the elements i = k mod 8, so the order is fixed by len and results never
// depend on the thread count. The lanes are two 4-double vectors (GCC's
// vector extensions, which any x86 ISA lowers): GCC leaves the same loop
// over a lane array scalar (the float -> double widening), and that was
// most of batchnorm's time.
using Double4 = double __attribute__((vector_size(32)));
using Float4 = float __attribute__((vector_size(16)));

struct Lanes {
  Double4 lo = {0, 0, 0, 0}, hi = {0, 0, 0, 0};  // lanes 0-3, 4-7
  double Sum(double tail) const {
    return ((lo[0] + lo[1]) + (lo[2] + lo[3])) + ((hi[0] + hi[1]) + (hi[2] + hi[3])) + tail;
  }
};

// x[i..i+4) as doubles.
inline Double4 Load4(const float* x) {
  Float4 v;
  std::memcpy(&v, x, sizeof(v));
  return __builtin_convertvector(v, Double4);
}
inline Double4 Load4(const double* x) {
  Double4 v;
  std::memcpy(&v, x, sizeof(v));
  return v;
}

// sum of x[i].
template <typename T>
inline double SumLanes(const T* x, int64_t len) {
  Lanes l;
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    l.lo += Load4(x + i);
    l.hi += Load4(x + i + 4);
  }
  double tail = 0;
  for (; i < len; ++i) tail += static_cast<double>(x[i]);
  return l.Sum(tail);
}

// sum of v and of v^2, v = x[i] - shift, added to *s1 and *s2 in one pass.
template <typename T>
inline void SumCentred(const T* x, int64_t len, double shift, double* s1, double* s2) {
  Lanes a, b;
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const Double4 lo = Load4(x + i) - shift, hi = Load4(x + i + 4) - shift;
    a.lo += lo;
    a.hi += hi;
    b.lo += lo * lo;
    b.hi += hi * hi;
  }
  double ta = 0, tb = 0;
  for (; i < len; ++i) {
    const double v = static_cast<double>(x[i]) - shift;
    ta += v;
    tb += v * v;
  }
  *s1 += a.Sum(ta);
  *s2 += b.Sum(tb);
}

// sum of g[i] and of g[i] * (x[i] - mean), added to *sg and *sgx in one pass;
// with y (a fused ReLU's output), g[i] counts only where y[i] > 0.
template <typename T>
inline void SumGradAndGradCentred(const T* g, const T* y, const T* x, int64_t len, double mean,
                                  double* sg, double* sgx) {
  Lanes a, b;
  int64_t i = 0;
  auto load = [&](int64_t at) {
    const Double4 v = Load4(g + at);
    return y == nullptr ? v : (Load4(y + at) > 0 ? v : Double4{0, 0, 0, 0});
  };
  for (; i + 8 <= len; i += 8) {
    const Double4 glo = load(i), ghi = load(i + 4);
    a.lo += glo;
    a.hi += ghi;
    b.lo += glo * (Load4(x + i) - mean);
    b.hi += ghi * (Load4(x + i + 4) - mean);
  }
  double ta = 0, tb = 0;
  for (; i < len; ++i) {
    const double v = y == nullptr || y[i] > T(0) ? static_cast<double>(g[i]) : 0.0;
    ta += v;
    tb += v * (static_cast<double>(x[i]) - mean);
  }
  *sg += a.Sum(ta);
  *sgx += b.Sum(tb);
}

// fn(c, offset of row (i, c)) over the rows of channels [c0, c1) of an
// [n, c_n, s_n] tensor, sample by sample: a sample's rows of the range are
// one contiguous span, which the prefetcher follows (a channel at a time
// jumps to another page every row).
template <typename Fn>
inline void ForRows(int64_t n, int64_t c_n, int64_t s_n, int64_t c0, int64_t c1, Fn&& fn) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = c0; c < c1; ++c) fn(c, (i * c_n + c) * s_n);
}

// A fused GELU (BatchNormLayer::FuseGelu): y[k] = gelu(y[k]) in place, and
// out[k] = g[k] * gelu'(u[k]) (out may be u). f32 runs 16 lanes at a time;
// f64 (the gradient checks' reference) the scalar erf.
template <typename T>
inline void GeluSpan(T* y, int64_t len) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::GeluErfInPlace(y, len);
  } else {
    for (int64_t k = 0; k < len; ++k) y[k] = act::GeluErf::Forward(y[k], T(0));
  }
}
template <typename T>
inline void GeluGradSpan(const T* u, const T* g, T* out, int64_t len) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::GeluErfGrad(u, g, out, len);
  } else {
    for (int64_t k = 0; k < len; ++k) out[k] = act::GeluErf::Backward(u[k], g[k], T(0));
  }
}

// Channel c's normalisation, y = (x - shift) * scale + bias in T, exactly as
// the forward applies it (a fused GELU's backward recomputes y with it).
template <typename T>
struct ChannelAffine {
  T shift, scale, bias;
};
template <typename T>
inline ChannelAffine<T> AffineOf(int64_t c, const std::vector<double>& mean,
                                 const std::vector<double>& inv_std, const T* gamma,
                                 const T* beta) {
  return {static_cast<T>(mean[c]),
          static_cast<T>((gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0) * inv_std[c]),
          beta != nullptr ? beta[c] : T(0)};
}

// Channels per parallel task: enough elements that scheduling is noise,
// and, since a task walks its channels sample by sample, at least 2048
// values (8 KB of f32) a sample, so the prefetcher streams them. A task of
// one 7x7 channel reads 196 bytes a sample, 50 KB apart: latency-bound,
// 2.5x slower at batch 1024 (bench/kernels_bench BM_BatchNormRelu).
int64_t ChannelGrain(int64_t s_n, int64_t m) {
  constexpr int64_t kSpan = 2048;
  const int64_t enough = (int64_t{1} << 14) / std::max<int64_t>(m, 1);
  return std::max<int64_t>({1, enough, kSpan / std::max<int64_t>(s_n, 1)});
}

// Every channel's AffineOf, as arrays a channels-last row pass reads a
// lane at a time.
template <typename T>
struct ChannelAffines {
  std::vector<T> shift, scale, bias;
  ChannelAffines(int64_t c_n, const std::vector<double>& mean, const std::vector<double>& inv_std,
                 const T* gamma, const T* beta)
      : shift(c_n), scale(c_n), bias(c_n) {
    for (int64_t c = 0; c < c_n; ++c) {
      const ChannelAffine<T> f = AffineOf(c, mean, inv_std, gamma, beta);
      shift[c] = f.shift;
      scale[c] = f.scale;
      bias[c] = f.bias;
    }
  }
};

// One channel's value (V = double) or four channels' (V = Double4) at p.
template <typename V, typename T>
inline V LoadLanes(const T* p) {
  if constexpr (std::is_same_v<V, double>) {
    return static_cast<double>(*p);
  } else {
    return Load4(p);
  }
}

// Channels-last per-channel sums over rows [r0, r1) of [rows, c_n] data:
// s1[c] and s2[c] get the sums over the rows of two terms that
// terms(r, c, a, b) adds into a and b for channel c (V = double) or
// channels [c, c + 4) (V = Double4). Sixteen channels are summed at a time
// in registers (eight independent chains) over a block of rows that stays
// in L1, then added into s1 and s2 once a block. (A memory accumulator per
// channel, updated every row, serialises on store-to-load forwarding, and
// GCC left that loop scalar: 4.6x slower than NCHW on ResNet-18's shapes.)
// The order of the additions is a function of r0, r1 and c_n alone.
template <typename Terms>
inline void SumChannelTiles(int64_t r0, int64_t r1, int64_t c_n, double* s1, double* s2,
                            Terms&& terms) {
  const int64_t block = std::max<int64_t>(8, 2048 / c_n);
  for (int64_t rb = r0; rb < r1; rb += block) {
    const int64_t re = std::min(r1, rb + block);
    int64_t c = 0;
    for (; c + 16 <= c_n; c += 16) {
      Double4 a[4] = {}, b[4] = {};
      for (int64_t r = rb; r < re; ++r)
        for (int k = 0; k < 4; ++k) terms(r, c + 4 * k, a[k], b[k]);
      for (int k = 0; k < 4; ++k)
        for (int j = 0; j < 4; ++j) {
          s1[c + 4 * k + j] += a[k][j];
          s2[c + 4 * k + j] += b[k][j];
        }
    }
    for (; c + 4 <= c_n; c += 4) {
      Double4 a = {}, b = {};
      for (int64_t r = rb; r < re; ++r) terms(r, c, a, b);
      for (int j = 0; j < 4; ++j) {
        s1[c + j] += a[j];
        s2[c + j] += b[j];
      }
    }
    for (; c < c_n; ++c) {
      double a = 0, b = 0;
      for (int64_t r = rb; r < re; ++r) terms(r, c, a, b);
      s1[c] += a;
      s2[c] += b;
    }
  }
}

// Channel statistics from `count` values whose sums centred on `shift` are
// s1 (of x - shift) and s2 (of its square): the batch mean and biased
// variance. Updates the running statistics as PyTorch does (with the
// unbiased variance).
template <typename T>
inline std::pair<double, double> BatchStats(double count, double shift, double s1, double s2,
                                            double momentum, T* rmean, T* rvar) {
  const double d = s1 / count;
  const double mean = shift + d;
  const double ss = std::max(s2 - s1 * d, 0.0);  // sum((x - mean)^2)
  *rmean = static_cast<T>((1 - momentum) * *rmean + momentum * mean);
  *rvar = static_cast<T>((1 - momentum) * *rvar + momentum * (ss / (count - 1)));
  return {mean, ss / count};
}

// Channels-last ([rows, C], rows = N * H * W): per-channel sums over rows
// in a fixed number of row chunks (a function of the shape only), each in
// double, added in chunk order: the same for any thread count.
// fn(r0, r1, acc) adds rows [r0, r1)'s sums into acc[width] (zeroed);
// out[width] receives the totals.
int64_t RowGrain(int64_t c_n) { return std::max<int64_t>(1, (int64_t{1} << 14) / c_n); }
template <typename Fn>
void SumRowChunks(int64_t rows, int64_t c_n, int64_t width, double* out, Fn&& fn) {
  const int64_t chunks = cpu::NumChunks(rows, RowGrain(c_n));
  std::vector<double> part(chunks * width, 0.0);
  cpu::ForChunks(rows, chunks,
                 [&](int64_t k, int64_t r0, int64_t r1) { fn(r0, r1, part.data() + k * width); });
  std::fill_n(out, width, 0.0);
  for (int64_t k = 0; k < chunks; ++k)
    for (int64_t i = 0; i < width; ++i) out[i] += part[k * width + i];
}

// SyncBN sums travel as float (ForwardContext::sync_sum). A double v is
// sent as the pair hi = float(v), lo = float(v - hi): with one replica (or
// an identity sync, as in the f64 gradient checks) v comes back to ~48
// bits; over N replicas the error is that of the float sum of the hi parts,
// ~N * 2^-24 relative, about the precision of f32 data itself. The mean is
// then corrected by a second pass around the pass-1 mean, so its error is
// relative to the spread of the data, not to |mean|.
inline void PutSplit(double v, float* hi, float* lo) {
  *hi = static_cast<float>(v);
  *lo = static_cast<float>(v - static_cast<double>(*hi));
}
inline double GetSplit(float hi, float lo) {
  return static_cast<double>(hi) + static_cast<double>(lo);
}

// A count as two floats, count = a * 4096 + b with 0 <= b < 4096: the sums
// over replicas stay exact integers up to 2^24 * 4096 = 2^36 values.
constexpr int64_t kCountBase = 4096;
inline void PutCount(int64_t count, float* out) {
  out[0] = static_cast<float>(count / kCountBase);
  out[1] = static_cast<float>(count % kCountBase);
}
inline double GetCount(const float* in) {
  return static_cast<double>(in[0]) * kCountBase + static_cast<double>(in[1]);
}

}  // namespace

BatchNormLayer::BatchNormLayer(const std::string& name, const Args& args)
    : Layer(name),
      momentum_(args.Float("momentum")),
      eps_(args.Float("eps")),
      affine_(args.Bool("affine")) {
  if (!(momentum_ >= 0.0 && momentum_ <= 1.0)) {
    throw ConfigError(
        StrCat("batchnorm '", name, "': momentum must be in [0, 1], got ", momentum_));
  }
  if (!(eps_ > 0.0)) {
    throw ConfigError(StrCat("batchnorm '", name, "': eps must be positive, got ", eps_));
  }
}

Shape BatchNormLayer::Build(const std::vector<Shape>& inputs, DType dtype) {
  CNNFLOW_ENFORCE(inputs.size() == 1, "batchnorm takes 1 input, got ", inputs.size());
  const Shape& s = inputs[0];
  if (s.rank() < 1 || s.rank() > 3) {
    throw ShapeError(StrCat("batchnorm expects a sample [C], [C, L] or [C, H, W], got ", s));
  }
  channels_ = s[0];
  spatial_ = s.numel() / std::max<int64_t>(channels_, 1);
  if (affine_) {
    AddParameter("weight", Shape{channels_}, dtype);
    AddParameter("bias", Shape{channels_}, dtype);
  }
  AddBuffer("running_mean", Tensor::Zeros(Shape{channels_}, dtype));
  AddBuffer("running_var", Tensor::Full(Shape{channels_}, 1.0, dtype));
  InitState();
  return s;
}

void BatchNormLayer::ResetParameters(Rng& /*rng*/) { InitState(); }

void BatchNormLayer::InitState() {
  auto ones = [&](Tensor& t) { t.CopyFrom(Tensor::Full(t.shape(), 1.0, t.dtype())); };
  if (affine_) {
    ones(parameters()[0].value);
    parameters()[1].value.Zero();
  }
  buffers()[0].value.Zero();
  ones(buffers()[1].value);
}

void BatchNormLayer::SetStats(int64_t c, double mean, double var) {
  mean_[c] = mean;
  inv_std_[c] = 1.0 / std::sqrt(var + eps_);
}

double BatchNormLayer::SyncCountAndShift(int64_t local_count, const Shape& in_shape) {
  const int64_t c_n = channels_;
  float* buf = sync_buf_.data();
  PutCount(local_count, &buf[2 * c_n]);
  (*sync_sum_)(buf, 2 * c_n + 2);
  const double count = GetCount(&buf[2 * c_n]);
  if (!(count > 1)) {
    throw Error(StrCat("batchnorm ", name(),
                       ": expected more than 1 value per channel over the synced replicas "
                       "when training, got ",
                       count, " (this replica's input ", in_shape, ")"));
  }
  count_ = count;
  shift_.resize(c_n);
  for (int64_t c = 0; c < c_n; ++c) shift_[c] = GetSplit(buf[c], buf[c_n + c]) / count;
  return count;
}

void BatchNormLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                             const ForwardContext& ctx) {
  const Tensor& in = *x[0];
  const int64_t n = in.dim(0);
  const int64_t c_n = channels_, s_n = spatial_;
  const int64_t m = n * s_n;  // values per channel (this replica's shard)
  CNNFLOW_ENFORCE(in.numel() == n * c_n * s_n && y.numel() == in.numel(), "batchnorm ", name(),
                  ": input ", in.shape(), " output ", y.shape());
  // Held running statistics (a frozen BN) normalise as in evaluation.
  const bool training = ctx.training && !hold_running_stats_;
  last_training_ = training;
  sync_sum_ = training ? ctx.sync_sum : nullptr;
  if (sync_sum_ != nullptr && !*sync_sum_) {
    throw Error(StrCat("batchnorm ", name(),
                       ": ForwardContext::sync_sum points to an empty "
                       "function"));
  }
  if (training && sync_sum_ == nullptr && m <= 1) {
    throw Error(StrCat("batchnorm ", name(),
                       ": expected more than 1 value per channel when training, got input ",
                       in.shape()));
  }
  local_count_ = m;
  count_ = static_cast<double>(m);
  mean_.resize(c_n);
  inv_std_.resize(c_n);
  if (nhwc_input()) {
    ForwardNhwc(in, y, training);
    return;
  }
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    T* ys = y.data<T>();
    const T* gamma = affine_ ? parameters()[0].value.data<T>() : nullptr;
    const T* beta = affine_ ? parameters()[1].value.data<T>() : nullptr;
    T* rmean = buffers()[0].value.data<T>();
    T* rvar = buffers()[1].value.data<T>();
    const double momentum = momentum_;
    // Channels are independent: each task owns a range of whole channels, so
    // every statistic is one serial-order sum (deterministic for any split).
    auto for_rows = [&](int64_t c0, int64_t c1, auto&& fn) { ForRows(n, c_n, s_n, c0, c1, fn); };
    // sum(x - shift) and sum((x - shift)^2) per channel of [c0, c1), shift ~
    // the mean: the second pass that avoids the cancellation of E[x^2] -
    // E[x]^2; the first sum corrects the mean for the rounding of shift.
    auto centred_sums = [&](int64_t c0, int64_t c1, const double* shift, double* s1, double* s2) {
      std::fill_n(s1, c1 - c0, 0.0);
      std::fill_n(s2, c1 - c0, 0.0);
      for_rows(c0, c1, [&](int64_t c, int64_t at) {
        SumCentred(xs + at, s_n, shift[c - c0], &s1[c - c0], &s2[c - c0]);
      });
    };
    // y = (x - mean) * a + beta with a = gamma / std (subtracting first
    // keeps f32 precise when |mean| >> std), over channels [c0, c1) whose
    // statistics are set; a fused GELU then runs over each sample's span of
    // them (contiguous).
    auto normalise = [&](int64_t c0, int64_t c1) {
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t at = (i * c_n + c) * s_n;
          const auto [tm, a, b] = AffineOf(c, mean_, inv_std_, gamma, beta);
          const T* row = xs + at;
          T* out = ys + at;
          if (relu_) {
            for (int64_t k = 0; k < s_n; ++k) out[k] = std::max((row[k] - tm) * a + b, T(0));
          } else {
            for (int64_t k = 0; k < s_n; ++k) out[k] = (row[k] - tm) * a + b;
          }
        }
        if (gelu_) GeluSpan(ys + (i * c_n + c0) * s_n, (c1 - c0) * s_n);
      }
    };
    // Batch statistics from the (global) count and centred sums; updates
    // the running statistics.
    auto finish = [&](int64_t c, double count, double shift, double s1, double s2) {
      const auto [mean, var] = BatchStats(count, shift, s1, s2, momentum, &rmean[c], &rvar[c]);
      SetStats(c, mean, var);
    };

    if (!training) {
      cpu::ParallelFor(c_n, ChannelGrain(s_n, m), [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          SetStats(c, static_cast<double>(rmean[c]), static_cast<double>(rvar[c]));
        }
        normalise(c0, c1);
      });
    } else if (sync_sum_ == nullptr) {
      // One pass of sums centred on the first sample's mean: within a few
      // standard deviations of the batch mean, so the double sums lose
      // nothing f32 would keep (a pass fewer over x than centring on the
      // batch mean, as the synced path must).
      cpu::ParallelFor(c_n, ChannelGrain(s_n, m), [&](int64_t c0, int64_t c1) {
        std::vector<double> shift(c1 - c0), s1(c1 - c0), s2(c1 - c0);
        for (int64_t c = c0; c < c1; ++c) {
          shift[c - c0] = SumLanes(xs + c * s_n, s_n) / static_cast<double>(s_n);
        }
        centred_sums(c0, c1, shift.data(), s1.data(), s2.data());
        for (int64_t c = c0; c < c1; ++c) {
          finish(c, static_cast<double>(m), shift[c - c0], s1[c - c0], s2[c - c0]);
        }
        normalise(c0, c1);
      });
    } else {
      // Pass 1: [sum x (hi C, lo C), count (2)] -> the global count and a
      // per-channel shift (the mean up to the float rounding of the sum).
      sync_buf_.assign(2 * c_n + 2, 0.0f);
      float* buf = sync_buf_.data();
      cpu::ParallelFor(c_n, ChannelGrain(s_n, m), [&](int64_t c0, int64_t c1) {
        std::vector<double> sum(c1 - c0, 0.0);
        for_rows(c0, c1, [&](int64_t c, int64_t at) { sum[c - c0] += SumLanes(xs + at, s_n); });
        for (int64_t c = c0; c < c1; ++c) PutSplit(sum[c - c0], &buf[c], &buf[c_n + c]);
      });
      const double count = SyncCountAndShift(m, in.shape());
      // Pass 2: [sum(x - shift) (hi, lo), sum((x - shift)^2) (hi, lo)].
      sync_buf_.assign(4 * c_n, 0.0f);
      buf = sync_buf_.data();
      cpu::ParallelFor(c_n, ChannelGrain(s_n, m), [&](int64_t c0, int64_t c1) {
        std::vector<double> s1(c1 - c0), s2(c1 - c0);
        centred_sums(c0, c1, shift_.data() + c0, s1.data(), s2.data());
        for (int64_t c = c0; c < c1; ++c) {
          PutSplit(s1[c - c0], &buf[c], &buf[c_n + c]);
          PutSplit(s2[c - c0], &buf[2 * c_n + c], &buf[3 * c_n + c]);
        }
      });
      (*sync_sum_)(buf, 4 * c_n);
      cpu::ParallelFor(c_n, ChannelGrain(s_n, m), [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          finish(c, count, shift_[c], GetSplit(buf[c], buf[c_n + c]),
                 GetSplit(buf[2 * c_n + c], buf[3 * c_n + c]));
        }
        normalise(c0, c1);
      });
    }
  });
}

void BatchNormLayer::Backward(const std::vector<const Tensor*>& x, const Tensor& y,
                              const Tensor& dy, const std::vector<Tensor*>& dx) {
  const Tensor& in = *x[0];
  const int64_t n = in.dim(0);
  const int64_t c_n = channels_, s_n = spatial_;
  const int64_t m = n * s_n;
  CNNFLOW_ENFORCE(
      dy.numel() == in.numel() && static_cast<int64_t>(mean_.size()) == c_n && m == local_count_,
      "batchnorm ", name(), ": backward without a matching forward, x ", in.shape(), " dy ",
      dy.shape());
  if (nhwc_input()) {
    BackwardNhwc(in, dy, dx[0]);
    return;
  }
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    const T* g = dy.data<T>();
    T* d = dx[0] != nullptr ? dx[0]->data<T>() : nullptr;
    // With a fused ReLU, dy is the gradient of max(bn, 0): each row of it
    // counts only where y > 0, masked where it is read.
    const T* ys = relu_ ? y.data<T>() : nullptr;
    auto for_rows = [&](int64_t c0, int64_t c1, auto&& fn) { ForRows(n, c_n, s_n, c0, c1, fn); };
    const T* gamma = affine_ ? parameters()[0].value.data<T>() : nullptr;
    const T* beta = affine_ ? parameters()[1].value.data<T>() : nullptr;
    T* dgamma = affine_ ? parameters()[0].grad.data<T>() : nullptr;
    T* dbeta = affine_ ? parameters()[1].grad.data<T>() : nullptr;
    const bool training = last_training_;
    const double inv_count = 1.0 / count_;
    // With a fused GELU, dy is the gradient of gelu(bn): local_sums takes it
    // through the GELU at bn(x), recomputed from x a sample's span at a time,
    // and leaves that gradient in dx (when wanted), where the dx passes
    // read it and overwrite it in place.
    const bool du_in_dx = gelu_ && d != nullptr;
    auto grad_at = [&](int64_t at) -> const T* { return du_in_dx ? d + at : g + at; };
    // This replica's sum(dy) and sum(dy * xhat) per channel of [c0, c1),
    // xhat = (x - mean) * inv_std; the parameter gradients are these LOCAL sums.
    auto local_sums = [&](int64_t c0, int64_t c1, double* sum_dy, double* sum_dy_xhat) {
      std::fill_n(sum_dy, c1 - c0, 0.0);
      std::fill_n(sum_dy_xhat, c1 - c0, 0.0);
      const int64_t span = (c1 - c0) * s_n;
      std::vector<T> u(gelu_ ? span : 0);  // bn(x) over a sample's span
      for (int64_t i = 0; i < n; ++i) {
        const int64_t at0 = (i * c_n + c0) * s_n;
        const T* grad = g + at0;
        if (gelu_) {
          for (int64_t c = c0; c < c1; ++c) {
            const auto [tm, a, b] = AffineOf(c, mean_, inv_std_, gamma, beta);
            const T* row = xs + at0 + (c - c0) * s_n;
            T* out = u.data() + (c - c0) * s_n;
            for (int64_t k = 0; k < s_n; ++k) out[k] = (row[k] - tm) * a + b;
          }
          T* du = du_in_dx ? d + at0 : u.data();
          GeluGradSpan(u.data(), g + at0, du, span);
          grad = du;
        }
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t at = at0 + (c - c0) * s_n;
          SumGradAndGradCentred(grad + (c - c0) * s_n, ys != nullptr ? ys + at : nullptr, xs + at,
                                s_n, mean_[c], &sum_dy[c - c0], &sum_dy_xhat[c - c0]);
        }
      }
      for (int64_t c = c0; c < c1; ++c) {
        sum_dy_xhat[c - c0] *= inv_std_[c];
        if (dgamma != nullptr) {
          dgamma[c] += static_cast<T>(sum_dy_xhat[c - c0]);
          dbeta[c] += static_cast<T>(sum_dy[c - c0]);
        }
      }
    };
    // dx = gamma * inv_std * (dy - mean(dy) - xhat * mean(dy * xhat)) with the
    // means over the (global) batch, written as dx = dy * k + (x - mean) * u + v:
    // per-channel constants, a short inner loop. dy is masked where y <= 0
    // (both loads unconditional, so the loops vectorise).
    auto input_grad = [&](int64_t c0, int64_t c1, const double* sum_dy, const double* sum_dy_xhat) {
      for_rows(c0, c1, [&](int64_t c, int64_t at) {
        const double inv_std = inv_std_[c];
        const double scale = (gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0) * inv_std;
        const T tk = static_cast<T>(scale);
        const T tu = static_cast<T>(-scale * inv_std * sum_dy_xhat[c - c0] * inv_count);
        const T tv = static_cast<T>(-scale * sum_dy[c - c0] * inv_count);
        const T tm = static_cast<T>(mean_[c]);
        const T* grow = grad_at(at);
        const T* row = xs + at;
        T* out = d + at;
        if (ys == nullptr) {
          for (int64_t k = 0; k < s_n; ++k) out[k] = grow[k] * tk + (row[k] - tm) * tu + tv;
          return;
        }
        const T* yrow = ys + at;
        for (int64_t k = 0; k < s_n; ++k) {
          const T gk = grow[k];
          out[k] = (yrow[k] > T(0) ? gk : T(0)) * tk + (row[k] - tm) * tu + tv;
        }
      });
    };
    // Evaluation: the running statistics are constants, only the affine map remains.
    auto affine_grad = [&](int64_t c0, int64_t c1) {
      for_rows(c0, c1, [&](int64_t c, int64_t at) {
        const T tk =
            static_cast<T>((gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0) * inv_std_[c]);
        const T* grow = grad_at(at);
        T* out = d + at;
        if (ys == nullptr) {
          for (int64_t k = 0; k < s_n; ++k) out[k] = grow[k] * tk;
          return;
        }
        const T* yrow = ys + at;
        for (int64_t k = 0; k < s_n; ++k) {
          const T gk = grow[k];
          out[k] = (yrow[k] > T(0) ? gk : T(0)) * tk;
        }
      });
    };

    if (training && sync_sum_ != nullptr && d != nullptr) {
      // One call: [sum dy (hi C, lo C), sum dy * xhat (hi C, lo C)].
      sync_buf_.assign(4 * c_n, 0.0f);
      float* buf = sync_buf_.data();
      cpu::ParallelFor(c_n, ChannelGrain(s_n, m), [&](int64_t c0, int64_t c1) {
        std::vector<double> sum_dy(c1 - c0), sum_dy_xhat(c1 - c0);
        local_sums(c0, c1, sum_dy.data(), sum_dy_xhat.data());
        for (int64_t c = c0; c < c1; ++c) {
          PutSplit(sum_dy[c - c0], &buf[c], &buf[c_n + c]);
          PutSplit(sum_dy_xhat[c - c0], &buf[2 * c_n + c], &buf[3 * c_n + c]);
        }
      });
      (*sync_sum_)(buf, 4 * c_n);
      cpu::ParallelFor(c_n, ChannelGrain(s_n, m), [&](int64_t c0, int64_t c1) {
        std::vector<double> sum_dy(c1 - c0), sum_dy_xhat(c1 - c0);
        for (int64_t c = c0; c < c1; ++c) {
          sum_dy[c - c0] = GetSplit(buf[c], buf[c_n + c]);
          sum_dy_xhat[c - c0] = GetSplit(buf[2 * c_n + c], buf[3 * c_n + c]);
        }
        input_grad(c0, c1, sum_dy.data(), sum_dy_xhat.data());
      });
      return;
    }
    cpu::ParallelFor(c_n, ChannelGrain(s_n, m), [&](int64_t c0, int64_t c1) {
      std::vector<double> sum_dy(c1 - c0), sum_dy_xhat(c1 - c0);
      local_sums(c0, c1, sum_dy.data(), sum_dy_xhat.data());
      if (d == nullptr) return;
      if (training) {
        input_grad(c0, c1, sum_dy.data(), sum_dy_xhat.data());
      } else {
        affine_grad(c0, c1);
      }
    });
  });
}

// Channels-last: x [N, H, W, C] as rows of C values. The same statistics,
// passes and fusions as the NCHW code above; the sums go over row chunks
// (SumRowChunks) and each pass runs along rows, a channel per lane.
void BatchNormLayer::ForwardNhwc(const Tensor& in, Tensor& y, bool training) {
  const int64_t c_n = channels_, s_n = spatial_, rows = in.dim(0) * s_n;
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    const bool bf16_out = y.dtype() == DType::kBF16;
    CNNFLOW_ENFORCE(y.dtype() == in.dtype() || (bf16_out && std::is_same_v<T, float>), "batchnorm ",
                    name(), ": a ", DTypeName(y.dtype()), " output for a ", DTypeName(in.dtype()),
                    " input");
    const T* gamma = affine_ ? parameters()[0].value.data<T>() : nullptr;
    const T* beta = affine_ ? parameters()[1].value.data<T>() : nullptr;
    T* rmean = buffers()[0].value.data<T>();
    T* rvar = buffers()[1].value.data<T>();
    auto normalise = [&] {
      const ChannelAffines<T> f(c_n, mean_, inv_std_, gamma, beta);
      const T *tm = f.shift.data(), *a = f.scale.data(), *b = f.bias.data();
      // Rows [r0, r1) of y into out, f32 or f64 as x.
      auto rows_out = [&](int64_t r0, int64_t r1, T* out) {
        for (int64_t r = r0; r < r1; ++r, out += c_n) {
          const T* row = xs + r * c_n;
          if (relu_) {
            for (int64_t c = 0; c < c_n; ++c)
              out[c] = std::max((row[c] - tm[c]) * a[c] + b[c], T(0));
          } else {
            for (int64_t c = 0; c < c_n; ++c) out[c] = (row[c] - tm[c]) * a[c] + b[c];
          }
        }
        if (gelu_) GeluSpan(out - (r1 - r0) * c_n, (r1 - r0) * c_n);
      };
      cpu::ParallelFor(rows, RowGrain(c_n), [&](int64_t r0, int64_t r1) {
        if (!bf16_out) {
          rows_out(r0, r1, y.data<T>() + r0 * c_n);
          return;
        }
        if constexpr (std::is_same_v<T, float>) {
          // A block of rows at a time in f32, then rounded (as a bf16
          // convolution rounds an f32 input: the same bits).
          const int64_t block = std::max<int64_t>(1, 2048 / c_n);
          std::vector<float> buf(std::min(block, r1 - r0) * c_n);
          auto* y16 = static_cast<uint16_t*>(y.raw_data());
          for (int64_t rb = r0; rb < r1; rb += block) {
            const int64_t re = std::min(r1, rb + block);
            rows_out(rb, re, buf.data());
            cpu::ToBf16(buf.data(), y16 + rb * c_n, (re - rb) * c_n);
          }
        }
      });
    };
    // s[0, C): sum(x - shift), s[C, 2C): sum((x - shift)^2), per channel.
    auto centred_sums = [&](const double* shift, double* s) {
      SumRowChunks(rows, c_n, 2 * c_n, s, [&](int64_t r0, int64_t r1, double* acc) {
        SumChannelTiles(r0, r1, c_n, acc, acc + c_n, [&](int64_t r, int64_t c, auto& a, auto& b) {
          using V = std::remove_reference_t<decltype(a)>;
          const V v = LoadLanes<V>(xs + r * c_n + c) - LoadLanes<V>(shift + c);
          a += v;
          b += v * v;
        });
      });
    };
    if (!training) {
      for (int64_t c = 0; c < c_n; ++c) {
        SetStats(c, static_cast<double>(rmean[c]), static_cast<double>(rvar[c]));
      }
      normalise();
      return;
    }
    std::vector<double> sums(2 * c_n);
    if (sync_sum_ == nullptr) {
      // Centred on the first sample's mean, as the NCHW path.
      std::vector<double> shift(c_n, 0.0);
      for (int64_t r = 0; r < s_n; ++r)
        for (int64_t c = 0; c < c_n; ++c) shift[c] += static_cast<double>(xs[r * c_n + c]);
      for (double& v : shift) v /= static_cast<double>(s_n);
      centred_sums(shift.data(), sums.data());
      for (int64_t c = 0; c < c_n; ++c) {
        const auto [mean, var] = BatchStats(static_cast<double>(rows), shift[c], sums[c],
                                            sums[c_n + c], momentum_, &rmean[c], &rvar[c]);
        SetStats(c, mean, var);
      }
      normalise();
      return;
    }
    // Synced: the NCHW path's two sync_sum calls, with the same packing.
    // sums[0, C): sum(x) (the second half stays zero).
    SumRowChunks(rows, c_n, 2 * c_n, sums.data(), [&](int64_t r0, int64_t r1, double* acc) {
      SumChannelTiles(r0, r1, c_n, acc, acc + c_n, [&](int64_t r, int64_t c, auto& a, auto&) {
        a += LoadLanes<std::remove_reference_t<decltype(a)>>(xs + r * c_n + c);
      });
    });
    sync_buf_.assign(2 * c_n + 2, 0.0f);
    float* buf = sync_buf_.data();
    for (int64_t c = 0; c < c_n; ++c) PutSplit(sums[c], &buf[c], &buf[c_n + c]);
    const double count = SyncCountAndShift(rows, in.shape());
    centred_sums(shift_.data(), sums.data());
    sync_buf_.assign(4 * c_n, 0.0f);
    buf = sync_buf_.data();
    for (int64_t c = 0; c < c_n; ++c) {
      PutSplit(sums[c], &buf[c], &buf[c_n + c]);
      PutSplit(sums[c_n + c], &buf[2 * c_n + c], &buf[3 * c_n + c]);
    }
    (*sync_sum_)(buf, 4 * c_n);
    for (int64_t c = 0; c < c_n; ++c) {
      const auto [mean, var] =
          BatchStats(count, shift_[c], GetSplit(buf[c], buf[c_n + c]),
                     GetSplit(buf[2 * c_n + c], buf[3 * c_n + c]), momentum_, &rmean[c], &rvar[c]);
      SetStats(c, mean, var);
    }
    normalise();
  });
}

void BatchNormLayer::BackwardNhwc(const Tensor& in, const Tensor& dy, Tensor* dx) {
  const int64_t c_n = channels_, s_n = spatial_, rows = in.dim(0) * s_n;
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    const T* g = dy.data<T>();
    T* d = dx != nullptr ? dx->data<T>() : nullptr;
    const T* gamma = affine_ ? parameters()[0].value.data<T>() : nullptr;
    const T* beta = affine_ ? parameters()[1].value.data<T>() : nullptr;
    T* dgamma = affine_ ? parameters()[0].grad.data<T>() : nullptr;
    T* dbeta = affine_ ? parameters()[1].grad.data<T>() : nullptr;
    const ChannelAffines<T> f(c_n, mean_, inv_std_, gamma, beta);
    const T *tm = f.shift.data(), *a = f.scale.data(), *b = f.bias.data();
    // A fused activation: dy through it at bn(x), recomputed from x a block
    // of rows at a time (y is never read: it may be bf16, WritesBf16), left
    // in dx when wanted (the dx pass then overwrites it in place).
    const bool fused = gelu_ || relu_;
    const bool du_in_dx = fused && d != nullptr;
    const T* grad = du_in_dx ? d : g;
    // sums[0, C): sum(dy), sums[C, 2C): sum(dy * (x - mean)), this replica's.
    std::vector<double> sums(2 * c_n);
    const double* mean = mean_.data();
    SumRowChunks(rows, c_n, 2 * c_n, sums.data(), [&](int64_t r0, int64_t r1, double* acc) {
      const int64_t block =
          fused ? std::max<int64_t>(8, 2048 / c_n) : std::max<int64_t>(1, r1 - r0);
      // bn(x) for a GELU, or the activation's dy when dx does not hold it.
      std::vector<T> u(gelu_ || (fused && !du_in_dx) ? block * c_n : 0);
      for (int64_t rb = r0; rb < r1; rb += block) {
        const int64_t re = std::min(r1, rb + block);
        const T* gb = g + rb * c_n;
        if (fused) {
          T* du = du_in_dx ? d + rb * c_n : u.data();
          for (int64_t r = rb; r < re; ++r) {
            const T* row = xs + r * c_n;
            if (relu_) {  // the forward's expression, so the same mask as max(., 0)
              const T* gr = g + r * c_n;
              T* dr = du + (r - rb) * c_n;
              for (int64_t c = 0; c < c_n; ++c)
                dr[c] = (row[c] - tm[c]) * a[c] + b[c] > T(0) ? gr[c] : T(0);
            } else {
              T* out = u.data() + (r - rb) * c_n;
              for (int64_t c = 0; c < c_n; ++c) out[c] = (row[c] - tm[c]) * a[c] + b[c];
            }
          }
          if (gelu_) GeluGradSpan(u.data(), g + rb * c_n, du, (re - rb) * c_n);
          gb = du;
        }
        // dy (through the fused activation) and dy * (x - mean).
        auto grad_terms = [&](int64_t r, int64_t c, auto& a, auto& b) {
          using V = std::remove_reference_t<decltype(a)>;
          const V v = LoadLanes<V>(gb + (r - rb) * c_n + c);
          a += v;
          b += v * (LoadLanes<V>(xs + r * c_n + c) - LoadLanes<V>(mean + c));
        };
        SumChannelTiles(rb, re, c_n, acc, acc + c_n, grad_terms);
      }
    });
    for (int64_t c = 0; c < c_n; ++c) {
      sums[c_n + c] *= inv_std_[c];
      if (dgamma != nullptr) {
        dgamma[c] += static_cast<T>(sums[c_n + c]);
        dbeta[c] += static_cast<T>(sums[c]);
      }
    }
    if (d == nullptr) return;
    if (last_training_ && sync_sum_ != nullptr) {
      sync_buf_.assign(4 * c_n, 0.0f);
      float* buf = sync_buf_.data();
      for (int64_t c = 0; c < c_n; ++c) {
        PutSplit(sums[c], &buf[c], &buf[c_n + c]);
        PutSplit(sums[c_n + c], &buf[2 * c_n + c], &buf[3 * c_n + c]);
      }
      (*sync_sum_)(buf, 4 * c_n);
      for (int64_t c = 0; c < c_n; ++c) {
        sums[c] = GetSplit(buf[c], buf[c_n + c]);
        sums[c_n + c] = GetSplit(buf[2 * c_n + c], buf[3 * c_n + c]);
      }
    }
    // dx = dy * k + (x - mean) * u + v per channel (training), dy * k
    // (evaluation: the running statistics are constants).
    const double inv_count = 1.0 / count_;
    std::vector<T> tk(c_n), tu(c_n, T(0)), tv(c_n, T(0));
    for (int64_t c = 0; c < c_n; ++c) {
      const double scale = (gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0) * inv_std_[c];
      tk[c] = static_cast<T>(scale);
      if (last_training_) {
        tu[c] = static_cast<T>(-scale * inv_std_[c] * sums[c_n + c] * inv_count);
        tv[c] = static_cast<T>(-scale * sums[c] * inv_count);
      }
    }
    cpu::ParallelFor(rows, RowGrain(c_n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* gr = grad + r * c_n;
        const T* row = xs + r * c_n;
        T* out = d + r * c_n;
        for (int64_t c = 0; c < c_n; ++c) out[c] = gr[c] * tk[c] + (row[c] - tm[c]) * tu[c] + tv[c];
      }
    });
  });
}

bool BatchNormLayer::WritesBf16() const { return nhwc_output() && cpu::CpuHasAvx512Bf16(); }

CNNFLOW_REGISTER_LAYER(
    batchnorm, BatchNormLayer,
    Schema("Batch normalisation over [C, H, W], [C, L] or [C] samples (torch.nn.BatchNorm2d / "
           "BatchNorm1d): per-channel statistics over the batch and spatial positions; running "
           "statistics for evaluation.")
        .Optional("momentum", ParamType::kFloat, 0.1,
                  "weight of the batch statistic in the running-statistics update")
        .Optional("eps", ParamType::kFloat, 1e-5, "added to the variance for stability")
        .Optional("affine", ParamType::kBool, true, "learn a per-channel scale and shift"));

}  // namespace cnnflow
