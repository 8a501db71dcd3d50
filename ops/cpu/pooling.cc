// CPU kernels of maxpool2d, avgpool2d and global_avgpool: independent
// [H, W] planes, so a ParallelFor over N*C planes needs no reduction.
#include "ops/layers/pooling.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/cpu/bf16_layout.h"
#include "ops/cpu/elementwise.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/onednn.h"
#include "ops/cpu/parallel.h"

namespace cnnflow {
namespace {

// Planes per parallel task: enough elements to pay for the task.
int64_t PlaneGrain(int64_t plane) {
  return std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(plane, 1));
}

// Window rows/cols [start, end) of output index o, clipped to [0, n).
inline void Window(int64_t o, int64_t stride, int64_t pad, int64_t kernel, int64_t n,
                   int64_t* start, int64_t* end) {
  const int64_t s = o * stride - pad;
  *start = std::max<int64_t>(s, 0);
  *end = std::min(s + kernel, n);
}

// PyTorch's comparison: a NaN always wins, so it propagates.
template <typename T>
inline bool Beats(T v, T best) {
  return v > best || v != v;
}

// The common 2x2 window, stride 2, no padding.
bool IsPlain2x2(const Pool2dGeometry& g) {
  return g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_h == 0 &&
         g.pad_w == 0 && g.WindowsInside();
}

// The 2x2 stride-2 window on f32 rows with AVX-512: 16 outputs per step,
// even/odd columns split by permutes, the same scan order and NaN rule as
// the scalar code (a later cell wins if strictly greater or NaN). Rows of
// 7-14 outputs are too short for the compiler to vectorise the scalar loop
// (the Fashion-MNIST shapes).
__attribute__((target("avx512f"))) void MaxPool2x2RowAvx512(const float* r0, const float* r1,
                                                            int64_t out_w, int32_t base,
                                                            int32_t w_in, float* yo, int32_t* io) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int64_t ow = 0; ow < out_w; ow += 16) {
    const int64_t count = std::min<int64_t>(16, out_w - ow);
    const int64_t cells = 2 * count;
    const __mmask16 lo_mask = cells >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << cells) - 1);
    const __mmask16 hi_mask = cells > 16 ? static_cast<__mmask16>((1u << (cells - 16)) - 1) : 0;
    const __mmask16 out_mask = count == 16 ? 0xFFFF : static_cast<__mmask16>((1u << count) - 1);
    const float* a = r0 + 2 * ow;
    const float* b = r1 + 2 * ow;
    const __m512 a_lo = _mm512_maskz_loadu_ps(lo_mask, a),
                 a_hi = _mm512_maskz_loadu_ps(hi_mask, a + 16);
    const __m512 b_lo = _mm512_maskz_loadu_ps(lo_mask, b),
                 b_hi = _mm512_maskz_loadu_ps(hi_mask, b + 16);
    const __m512 cells_in[3] = {_mm512_permutex2var_ps(a_lo, odd, a_hi),
                                _mm512_permutex2var_ps(b_lo, even, b_hi),
                                _mm512_permutex2var_ps(b_lo, odd, b_hi)};
    const __m512i i0 = _mm512_add_epi32(
        _mm512_set1_epi32(base + static_cast<int32_t>(2 * ow)),
        _mm512_slli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                          1));
    const int32_t offsets[3] = {1, w_in, w_in + 1};
    __m512 m = _mm512_permutex2var_ps(a_lo, even, a_hi);
    __m512i im = i0;
    for (int k = 0; k < 3; ++k) {
      const __m512 v = cells_in[k];
      const __mmask16 wins =
          _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      m = _mm512_mask_mov_ps(m, wins, v);
      im = _mm512_mask_mov_epi32(im, wins, _mm512_add_epi32(i0, _mm512_set1_epi32(offsets[k])));
    }
    _mm512_mask_storeu_ps(yo + ow, out_mask, m);
    _mm512_mask_storeu_epi32(io + ow, out_mask, im);
  }
}

// [x0..x7], [x8..x15] -> even [x0, x2, ..., x14] or odd [x1, ..., x15].
// Functions, not lambdas in the caller: a lambda does not inherit its
// caller's target attribute, and clang rejects AVX types in it unless the
// whole file is built for AVX2 (CNNFLOW_NATIVE=OFF).
__attribute__((target("avx2,fma"))) inline __m256 EvenColumns(__m256 lo, __m256 hi) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(
      _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0))), 0xD8));
}
__attribute__((target("avx2,fma"))) inline __m256 OddColumns(__m256 lo, __m256 hi) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(
      _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1))), 0xD8));
}

// The same with AVX2: 8 outputs per step; the even and odd columns of 16
// input cells are split by in-lane shuffles and a cross-lane permute.
__attribute__((target("avx2,fma"))) void MaxPool2x2RowAvx2(const float* r0, const float* r1,
                                                           int64_t out_w, int32_t base,
                                                           int32_t w_in, float* yo, int32_t* io) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const auto even = EvenColumns;
  const auto odd = OddColumns;
  for (int64_t ow = 0; ow < out_w; ow += 8) {
    const int32_t count = static_cast<int32_t>(std::min<int64_t>(8, out_w - ow));
    const __m256i lo_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * count), lane);
    const __m256i hi_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * count - 8), lane);
    const __m256i out_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(count), lane);
    const float* a = r0 + 2 * ow;
    const float* b = r1 + 2 * ow;
    const __m256 a_lo = _mm256_maskload_ps(a, lo_mask), a_hi = _mm256_maskload_ps(a + 8, hi_mask);
    const __m256 b_lo = _mm256_maskload_ps(b, lo_mask), b_hi = _mm256_maskload_ps(b + 8, hi_mask);
    const __m256 cells_in[3] = {odd(a_lo, a_hi), even(b_lo, b_hi), odd(b_lo, b_hi)};
    const __m256i i0 = _mm256_add_epi32(_mm256_set1_epi32(base + static_cast<int32_t>(2 * ow)),
                                        _mm256_slli_epi32(lane, 1));
    const int32_t offsets[3] = {1, w_in, w_in + 1};
    __m256 m = even(a_lo, a_hi);
    __m256i im = i0;
    for (int k = 0; k < 3; ++k) {
      const __m256 v = cells_in[k];
      const __m256 wins =
          _mm256_or_ps(_mm256_cmp_ps(v, m, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      m = _mm256_blendv_ps(m, v, wins);
      const __m256i at = _mm256_add_epi32(i0, _mm256_set1_epi32(offsets[k]));
      im = _mm256_castps_si256(
          _mm256_blendv_ps(_mm256_castsi256_ps(im), _mm256_castsi256_ps(at), wins));
    }
    _mm256_maskstore_ps(yo + ow, out_mask, m);
    _mm256_maskstore_epi32(io + ow, out_mask, im);
  }
}

// One plane: x [H, W] -> y [H', W'], idx [H', W'] (flat index into x).
template <typename T>
void MaxPoolPlane(const Pool2dGeometry& g, const T* x, T* y, int32_t* idx) {
  const int64_t w_in = g.in_w;
  if constexpr (std::is_same_v<T, float>) {
    const cpu::Isa isa = cpu::MaxIsa();
    if (IsPlain2x2(g) && isa != cpu::Isa::kScalar) {
      auto row = isa == cpu::Isa::kAvx512 ? MaxPool2x2RowAvx512 : MaxPool2x2RowAvx2;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        row(x + 2 * oh * w_in, x + (2 * oh + 1) * w_in, g.out_w,
            static_cast<int32_t>(2 * oh * w_in), static_cast<int32_t>(w_in), y + oh * g.out_w,
            idx + oh * g.out_w);
      }
      return;
    }
  }
  if (IsPlain2x2(g)) {
    // Branch-free (selects) in PyTorch's scan order: (0,0), then a = (0,1),
    // b = (1,0), c = (1,1); a later cell wins only if strictly greater.
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      const T* r0 = x + 2 * oh * w_in;
      const T* r1 = r0 + w_in;
      T* yo = y + oh * g.out_w;
      int32_t* io = idx + oh * g.out_w;
      const int32_t base = static_cast<int32_t>(2 * oh * w_in);
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        const int32_t i0 = base + static_cast<int32_t>(2 * ow);
        T m = r0[2 * ow];
        int32_t im = i0;
        const T a = r0[2 * ow + 1], b = r1[2 * ow], c = r1[2 * ow + 1];
        bool t = Beats(a, m);
        m = t ? a : m;
        im = t ? i0 + 1 : im;
        t = Beats(b, m);
        m = t ? b : m;
        im = t ? i0 + static_cast<int32_t>(w_in) : im;
        t = Beats(c, m);
        m = t ? c : m;
        im = t ? i0 + static_cast<int32_t>(w_in) + 1 : im;
        yo[ow] = m;
        io[ow] = im;
      }
    }
    return;
  }
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    int64_t hs, he;
    Window(oh, g.stride_h, g.pad_h, g.kernel_h, g.in_h, &hs, &he);
    for (int64_t ow = 0; ow < g.out_w; ++ow) {
      int64_t ws, we;
      Window(ow, g.stride_w, g.pad_w, g.kernel_w, g.in_w, &ws, &we);
      T best = -std::numeric_limits<T>::infinity();
      int64_t arg = hs * w_in + ws;
      for (int64_t h = hs; h < he; ++h) {
        for (int64_t w = ws; w < we; ++w) {
          const T v = x[h * w_in + w];
          if (Beats(v, best)) {
            best = v;
            arg = h * w_in + w;
          }
        }
      }
      y[oh * g.out_w + ow] = best;
      idx[oh * g.out_w + ow] = static_cast<int32_t>(arg);
    }
  }
}

// One plane: dy [H', W'] and the argmax of each output -> dx [H, W]
// (overwritten). Zeroing then scattering beat writing each cell once with
// selects (measured 2x on the 2x2 case): the plane stays in L1.
template <typename T>
void MaxPoolPlaneBackward(const Pool2dGeometry& g, const T* dy, const int32_t* idx, T* dx) {
  std::fill_n(dx, g.in_plane(), T(0));
  for (int64_t o = 0; o < g.out_plane(); ++o) dx[idx[o]] += dy[o];
}

// Channels-last: one sample x [H, W, C] -> y [H', W', C] and the argmax of
// each output as its offset in the (unclipped) window, i * kw + j, per
// channel: a byte (kernel_h * kernel_w <= 256, MaxPool2d::ChannelsLast),
// a quarter of the traffic of a cell index. Each window's cells in
// PyTorch's scan order, a channel per lane.
template <typename T>
void MaxPoolSampleNhwc(const Pool2dGeometry& g, const T* x, T* y, uint8_t* win) {
  const int64_t c_n = g.channels;
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    int64_t hs, he;
    Window(oh, g.stride_h, g.pad_h, g.kernel_h, g.in_h, &hs, &he);
    const int64_t h0 = oh * g.stride_h - g.pad_h;
    for (int64_t ow = 0; ow < g.out_w; ++ow) {
      int64_t ws, we;
      Window(ow, g.stride_w, g.pad_w, g.kernel_w, g.in_w, &ws, &we);
      const int64_t w0 = ow * g.stride_w - g.pad_w;
      T* yo = y + (oh * g.out_w + ow) * c_n;
      uint8_t* io = win + (oh * g.out_w + ow) * c_n;
      std::fill_n(yo, c_n, -std::numeric_limits<T>::infinity());
      std::fill_n(io, c_n, static_cast<uint8_t>((hs - h0) * g.kernel_w + (ws - w0)));
      for (int64_t h = hs; h < he; ++h) {
        for (int64_t w = ws; w < we; ++w) {
          const T* xc = x + (h * g.in_w + w) * c_n;
          const auto at = static_cast<uint8_t>((h - h0) * g.kernel_w + (w - w0));
          for (int64_t c = 0; c < c_n; ++c) {
            const bool t = Beats(xc[c], yo[c]);
            yo[c] = t ? xc[c] : yo[c];
            io[c] = t ? at : io[c];
          }
        }
      }
    }
  }
}

// Windows that tile the input (stride = kernel, no padding): each cell is
// in at most one window.
bool WindowsTile(const Pool2dGeometry& g) {
  return g.stride_h == g.kernel_h && g.stride_w == g.kernel_w && g.pad_h == 0 && g.pad_w == 0 &&
         g.WindowsInside();
}

// Tiling windows: input row h of dx [H, W, C] into `row` (W * C values),
// dy [H', W', C] where the cell is its window's argmax and 0 elsewhere.
template <typename T>
void MaxPoolTiledRowBackwardNhwc(const Pool2dGeometry& g, const T* dy, const uint8_t* win,
                                 int64_t h, T* row) {
  const int64_t c_n = g.channels, oh = h / g.kernel_h;
  for (int64_t w = 0; w < g.in_w; ++w) {
    const int64_t ow = w / g.kernel_w;
    T* d = row + w * c_n;
    if (oh >= g.out_h || ow >= g.out_w) {
      std::fill_n(d, c_n, T(0));
      continue;
    }
    const auto at = static_cast<uint8_t>((h % g.kernel_h) * g.kernel_w + w % g.kernel_w);
    const uint8_t* io = win + (oh * g.out_w + ow) * c_n;
    const T* gr = dy + (oh * g.out_w + ow) * c_n;
    for (int64_t c = 0; c < c_n; ++c) d[c] = io[c] == at ? gr[c] : T(0);
  }
}

// One sample: dy [H', W', C] and the window argmax -> dx [H, W, C]
// (overwritten). Windows that tile the input hold each cell at most once,
// so dx is written in one pass, a row at a time (MaxPoolTiledRowBackwardNhwc),
// instead of zeroed and then scattered into (two passes over a tensor 4x the
// output's size).
template <typename T>
void MaxPoolSampleBackwardNhwc(const Pool2dGeometry& g, const T* dy, const uint8_t* win, T* dx) {
  const int64_t c_n = g.channels;
  if (WindowsTile(g)) {
    for (int64_t h = 0; h < g.in_h; ++h)
      MaxPoolTiledRowBackwardNhwc(g, dy, win, h, dx + h * g.in_w * c_n);
    return;
  }
  std::fill_n(dx, g.in_plane() * c_n, T(0));
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    for (int64_t ow = 0; ow < g.out_w; ++ow) {
      const int64_t o = oh * g.out_w + ow;
      const int64_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
      for (int64_t c = 0; c < c_n; ++c) {
        const int64_t off = win[o * c_n + c];
        const int64_t cell = (h0 + off / g.kernel_w) * g.in_w + w0 + off % g.kernel_w;
        dx[cell * c_n + c] += dy[o * c_n + c];
      }
    }
  }
}

// The same into a bf16 dx (MaxPool2d::WritesBf16Grad: tiling windows), each
// row through `row` (W * C floats) and then rounded.
void MaxPoolSampleBackwardNhwcBf16(const Pool2dGeometry& g, const float* dy, const uint8_t* win,
                                   uint16_t* dx, float* row) {
  const int64_t row_size = g.in_w * g.channels;
  for (int64_t h = 0; h < g.in_h; ++h) {
    MaxPoolTiledRowBackwardNhwc(g, dy, win, h, row);
    cpu::ToBf16(row, dx + h * row_size, row_size);
  }
}

// PyTorch's divisor: the window clipped to the padded input, or to the
// input itself when padding is not counted.
inline int64_t AvgDivisor(const Pool2dGeometry& g, int64_t oh, int64_t ow, bool include_pad) {
  const int64_t hs = oh * g.stride_h - g.pad_h, ws = ow * g.stride_w - g.pad_w;
  if (include_pad) {
    const int64_t he = std::min(hs + g.kernel_h, g.in_h + g.pad_h);
    const int64_t we = std::min(ws + g.kernel_w, g.in_w + g.pad_w);
    return (he - hs) * (we - ws);
  }
  const int64_t he = std::min(hs + g.kernel_h, g.in_h), we = std::min(ws + g.kernel_w, g.in_w);
  return (he - std::max<int64_t>(hs, 0)) * (we - std::max<int64_t>(ws, 0));
}

template <typename T>
void AvgPoolPlane(const Pool2dGeometry& g, bool include_pad, const T* x, T* y) {
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    int64_t hs, he;
    Window(oh, g.stride_h, g.pad_h, g.kernel_h, g.in_h, &hs, &he);
    for (int64_t ow = 0; ow < g.out_w; ++ow) {
      int64_t ws, we;
      Window(ow, g.stride_w, g.pad_w, g.kernel_w, g.in_w, &ws, &we);
      T s = 0;
      for (int64_t h = hs; h < he; ++h) {
        for (int64_t w = ws; w < we; ++w) s += x[h * g.in_w + w];
      }
      y[oh * g.out_w + ow] = s / static_cast<T>(AvgDivisor(g, oh, ow, include_pad));
    }
  }
}

// dx [H, W] overwritten from dy [H', W'].
template <typename T>
void AvgPoolPlaneBackward(const Pool2dGeometry& g, bool include_pad, const T* dy, T* dx) {
  std::fill_n(dx, g.in_plane(), T(0));
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    int64_t hs, he;
    Window(oh, g.stride_h, g.pad_h, g.kernel_h, g.in_h, &hs, &he);
    for (int64_t ow = 0; ow < g.out_w; ++ow) {
      int64_t ws, we;
      Window(ow, g.stride_w, g.pad_w, g.kernel_w, g.in_w, &ws, &we);
      const T v = dy[oh * g.out_w + ow] / static_cast<T>(AvgDivisor(g, oh, ow, include_pad));
      for (int64_t h = hs; h < he; ++h) {
        for (int64_t w = ws; w < we; ++w) dx[h * g.in_w + w] += v;
      }
    }
  }
}

std::pair<int64_t, int64_t> PairArg(const char* layer, const Args& args, const std::string& key,
                                    int64_t lo) {
  const std::vector<int64_t> v = args.Ints(key, 2);
  if (v[0] < lo || v[1] < lo) {
    throw ConfigError(
        StrCat(layer, ": '", key, "' must be >= ", lo, ", got [", v[0], ", ", v[1], "]"));
  }
  return {v[0], v[1]};
}

// PyTorch's output size (pooling_shape.h): (in + 2 pad - kernel) / stride
// + 1, rounded down, or up in ceil_mode unless the last window would start
// past the input and its left padding.
int64_t PooledSize(int64_t in, int64_t kernel, int64_t stride, int64_t pad, bool ceil_mode) {
  const int64_t span = in + 2 * pad - kernel;
  if (span < 0) return 0;
  int64_t out = (span + (ceil_mode ? stride - 1 : 0)) / stride + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

void CheckInput(const char* layer, const std::vector<const Tensor*>& x, const Tensor& y) {
  CNNFLOW_ENFORCE(x.size() == 1 && x[0]->is_contiguous() && y.is_contiguous(), layer,
                  " needs one contiguous input and a contiguous output");
}

}  // namespace

Pool2dBase::Pool2dBase(const std::string& name, const Args& args) : Layer(name) {
  std::tie(geom_.kernel_h, geom_.kernel_w) = PairArg("pooling", args, "kernel", 1);
  std::tie(geom_.stride_h, geom_.stride_w) = PairArg("pooling", args, "stride", 0);
  std::tie(geom_.pad_h, geom_.pad_w) = PairArg("pooling", args, "pad", 0);
  geom_.ceil_mode = args.Bool("ceil_mode");
  if (geom_.stride_h == 0) geom_.stride_h = geom_.kernel_h;
  if (geom_.stride_w == 0) geom_.stride_w = geom_.kernel_w;
  if (2 * geom_.pad_h > geom_.kernel_h || 2 * geom_.pad_w > geom_.kernel_w) {
    throw ConfigError(StrCat("pooling: 'pad' [", geom_.pad_h, ", ", geom_.pad_w,
                             "] must be at most half of 'kernel' [", geom_.kernel_h, ", ",
                             geom_.kernel_w, "]"));
  }
}

Shape Pool2dBase::Build(const std::vector<Shape>& inputs, DType) {
  if (inputs.size() != 1 || inputs[0].rank() != 3) {
    throw ShapeError(StrCat(type(), " expects one [C, H, W] input, got ",
                            inputs.empty() ? std::string("none") : inputs[0].ToString()));
  }
  const Shape& s = inputs[0];
  geom_.channels = s[0];
  geom_.in_h = s[1];
  geom_.in_w = s[2];
  geom_.out_h =
      PooledSize(geom_.in_h, geom_.kernel_h, geom_.stride_h, geom_.pad_h, geom_.ceil_mode);
  geom_.out_w =
      PooledSize(geom_.in_w, geom_.kernel_w, geom_.stride_w, geom_.pad_w, geom_.ceil_mode);
  if (geom_.in_h + 2 * geom_.pad_h < geom_.kernel_h ||
      geom_.in_w + 2 * geom_.pad_w < geom_.kernel_w || geom_.out_h <= 0 || geom_.out_w <= 0) {
    throw ShapeError(StrCat(type(), ": input ", s, " padded by ", geom_.pad_h, "x", geom_.pad_w,
                            " is smaller than the ", geom_.kernel_h, "x", geom_.kernel_w,
                            " kernel"));
  }
  CNNFLOW_ENFORCE(geom_.in_plane() <= std::numeric_limits<int32_t>::max(),
                  "pooling plane too large: ", s);
  return {geom_.channels, geom_.out_h, geom_.out_w};
}

void MaxPool2d::Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext&) {
  CheckInput("maxpool2d", x, y);
  const Pool2dGeometry& g = geom_;
  const int64_t planes = x[0]->dim(0) * g.channels;
  const bool nhwc = nhwc_input();
  const auto outputs = static_cast<size_t>(planes * g.out_plane());
  window_argmax_.resize(nhwc ? outputs : 0);
  argmax_.resize(nhwc ? 0 : outputs);
  DispatchFloat(y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = x[0]->data<T>();
    T* ys = y.data<T>();
    if (nhwc) {
      const int64_t in_sample = g.in_plane() * g.channels, out_sample = g.out_plane() * g.channels;
      uint8_t* win = window_argmax_.data();
      cpu::ParallelFor(x[0]->dim(0), PlaneGrain(in_sample), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          MaxPoolSampleNhwc(g, xs + i * in_sample, ys + i * out_sample, win + i * out_sample);
        }
      });
      return;
    }
    int32_t* idx = argmax_.data();
    cpu::ParallelFor(planes, PlaneGrain(g.in_plane()), [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        MaxPoolPlane(g, xs + p * g.in_plane(), ys + p * g.out_plane(), idx + p * g.out_plane());
      }
    });
  });
}

void MaxPool2d::Backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy,
                         const std::vector<Tensor*>& dx) {
  if (dx.empty() || dx[0] == nullptr) return;
  const Pool2dGeometry& g = geom_;
  const int64_t planes = x[0]->dim(0) * g.channels;
  const bool nhwc = nhwc_input();
  CNNFLOW_ENFORCE(
      static_cast<int64_t>(nhwc ? window_argmax_.size() : argmax_.size()) == planes * g.out_plane(),
      "maxpool2d: Backward without a matching Forward");
  const int64_t in_sample = g.in_plane() * g.channels, out_sample = g.out_plane() * g.channels;
  if (dx[0]->dtype() == DType::kBF16) {  // WritesBf16Grad
    CNNFLOW_ENFORCE(WritesBf16Grad(0) && dy.dtype() == DType::kF32, "maxpool2d ", name(),
                    ": a bf16 gradient it cannot write");
    const float* dys = dy.data<float>();
    auto* dxs = static_cast<uint16_t*>(dx[0]->raw_data());
    const uint8_t* win = window_argmax_.data();
    cpu::ParallelFor(x[0]->dim(0), PlaneGrain(in_sample), [&](int64_t b, int64_t e) {
      std::vector<float> row(g.in_w * g.channels);
      for (int64_t i = b; i < e; ++i) {
        MaxPoolSampleBackwardNhwcBf16(g, dys + i * out_sample, win + i * out_sample,
                                      dxs + i * in_sample, row.data());
      }
    });
    return;
  }
  DispatchFloat(dy.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* dys = dy.data<T>();
    T* dxs = dx[0]->data<T>();
    if (nhwc) {
      const uint8_t* win = window_argmax_.data();
      cpu::ParallelFor(x[0]->dim(0), PlaneGrain(in_sample), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          MaxPoolSampleBackwardNhwc(g, dys + i * out_sample, win + i * out_sample,
                                    dxs + i * in_sample);
        }
      });
      return;
    }
    const int32_t* idx = argmax_.data();
    cpu::ParallelFor(planes, PlaneGrain(g.in_plane()), [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        MaxPoolPlaneBackward(g, dys + p * g.out_plane(), idx + p * g.out_plane(),
                             dxs + p * g.in_plane());
      }
    });
  });
}

bool MaxPool2d::WritesBf16Grad(size_t input) const {
  return input == 0 && nhwc_input() && WindowsTile(geom_) && cpu::CpuHasAvx512Bf16();
}

int64_t MaxPool2d::ForwardFlops(int64_t n) const {
  return n * geom_.channels * geom_.out_plane() * geom_.kernel_h * geom_.kernel_w;
}

AvgPool2d::AvgPool2d(const std::string& name, const Args& args)
    : Pool2dBase(name, args), count_include_pad_(args.Bool("count_include_pad")) {}

void AvgPool2d::Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext&) {
  CheckInput("avgpool2d", x, y);
  const Pool2dGeometry& g = geom_;
  const int64_t planes = x[0]->dim(0) * g.channels;
  DispatchFloat(y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = x[0]->data<T>();
    T* ys = y.data<T>();
    cpu::ParallelFor(planes, PlaneGrain(g.in_plane()), [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        AvgPoolPlane(g, count_include_pad_, xs + p * g.in_plane(), ys + p * g.out_plane());
      }
    });
  });
}

void AvgPool2d::Backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy,
                         const std::vector<Tensor*>& dx) {
  if (dx.empty() || dx[0] == nullptr) return;
  const Pool2dGeometry& g = geom_;
  const int64_t planes = x[0]->dim(0) * g.channels;
  DispatchFloat(dy.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* dys = dy.data<T>();
    T* dxs = dx[0]->data<T>();
    cpu::ParallelFor(planes, PlaneGrain(g.in_plane()), [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        AvgPoolPlaneBackward(g, count_include_pad_, dys + p * g.out_plane(),
                             dxs + p * g.in_plane());
      }
    });
  });
}

int64_t AvgPool2d::ForwardFlops(int64_t n) const {
  return n * geom_.channels * geom_.out_plane() * geom_.kernel_h * geom_.kernel_w;
}

GlobalAvgPool::GlobalAvgPool(const std::string& name, const Args&) : Layer(name) {}

Shape GlobalAvgPool::Build(const std::vector<Shape>& inputs, DType) {
  if (inputs.size() != 1 || (inputs[0].rank() != 2 && inputs[0].rank() != 3)) {
    throw ShapeError(StrCat("global_avgpool expects one [C, H, W] or [C, L] input, got ",
                            inputs.empty() ? std::string("none") : inputs[0].ToString()));
  }
  const Shape& s = inputs[0];
  channels_ = s[0];
  plane_ = s.numel() / std::max<int64_t>(channels_, 1);
  if (plane_ <= 0) throw ShapeError(StrCat("global_avgpool: empty input planes in ", s));
  return {channels_};
}

void GlobalAvgPool::Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext&) {
  CheckInput("global_avgpool", x, y);
  const int64_t rows = x[0]->dim(0) * channels_;
  DispatchFloat(y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = x[0]->data<T>();
    T* ys = y.data<T>();
    const T inv = T(1) / static_cast<T>(plane_);
    cpu::ParallelFor(rows, PlaneGrain(plane_), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) ys[r] = RowSum(xs + r * plane_, plane_) * inv;
    });
  });
}

void GlobalAvgPool::Backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy,
                             const std::vector<Tensor*>& dx) {
  if (dx.empty() || dx[0] == nullptr) return;
  const int64_t rows = x[0]->dim(0) * channels_;
  DispatchFloat(dy.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* dys = dy.data<T>();
    T* dxs = dx[0]->data<T>();
    const T inv = T(1) / static_cast<T>(plane_);
    cpu::ParallelFor(rows, PlaneGrain(plane_), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) std::fill_n(dxs + r * plane_, plane_, dys[r] * inv);
    });
  });
}

int64_t GlobalAvgPool::ForwardFlops(int64_t n) const { return n * channels_ * plane_; }

CNNFLOW_REGISTER_LAYER(
    maxpool2d, MaxPool2d,
    Schema("2D max pooling [C, H, W] -> [C, H', W'] (torch.nn.MaxPool2d; padded cells never "
           "win; H' = (H + 2*pad - kernel) / stride + 1)")
        .Required("kernel", ParamType::kIntList, "window size: k or [kh, kw]")
        .Optional("stride", ParamType::kIntList, int64_t{0}, "stride: s or [sh, sw]; 0 = kernel")
        .Optional("pad", ParamType::kIntList, int64_t{0},
                  "implicit -inf padding on each side, at most kernel / 2")
        .Optional("ceil_mode", ParamType::kBool, false,
                  "round H', W' up (PyTorch's ceil_mode): a last window may hang over the "
                  "padded input, clipped to it"));

CNNFLOW_REGISTER_LAYER(
    avgpool2d, AvgPool2d,
    Schema("2D average pooling [C, H, W] -> [C, H', W'] (torch.nn.AvgPool2d; "
           "H' = (H + 2*pad - kernel) / stride + 1)")
        .Required("kernel", ParamType::kIntList, "window size: k or [kh, kw]")
        .Optional("stride", ParamType::kIntList, int64_t{0}, "stride: s or [sh, sw]; 0 = kernel")
        .Optional("pad", ParamType::kIntList, int64_t{0},
                  "implicit zero padding on each side, at most kernel / 2")
        .Optional("count_include_pad", ParamType::kBool, true,
                  "divide by the window size including padded cells (else by the valid cells)")
        .Optional("ceil_mode", ParamType::kBool, false,
                  "round H', W' up (PyTorch's ceil_mode): a last window may hang over the "
                  "padded input, clipped to it; its divisor stops at the padded input"));

CNNFLOW_REGISTER_LAYER(global_avgpool, GlobalAvgPool,
                       Schema("mean over each channel's plane: [C, H, W] or [C, L] -> [C]"));

}  // namespace cnnflow
