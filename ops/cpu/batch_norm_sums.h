// Batchnorm's sums and per-channel maps on the CPU, shared by its NCHW
// passes (ops/cpu/batch_norm.cc) and its channels-last ones
// (batch_norm_nhwc.cc): fixed-order double sums (results never depend on
// the thread count), the statistics and the running-statistics update, the
// affine maps, the fused GELU, and the float hi/lo packing of SyncBN's sums.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/cpu/gelu_vector.h"
#include "ops/cpu/parallel.h"
#include "ops/layers/activation.h"

namespace cnnflow::cpu::batch_norm {

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
inline int64_t ChannelGrain(int64_t s_n, int64_t m) {
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
inline int64_t RowGrain(int64_t c_n) { return std::max<int64_t>(1, (int64_t{1} << 14) / c_n); }
template <typename Fn>
inline void SumRowChunks(int64_t rows, int64_t c_n, int64_t width, double* out, Fn&& fn) {
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

}  // namespace cnnflow::cpu::batch_norm
