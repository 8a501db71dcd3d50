// The GEMM lowering of conv2d, one chunk of the batch per call (see
// lowering.h): im2col and col2im per sample and group, the per-sample
// GEMMs, and the lowering of a whole chunk into one GEMM.
#include "ops/cpu/conv/lowering.h"

#include <algorithm>

#include "ops/cpu/conv/scratch.h"
#include "ops/cpu/elementwise.h"
#include "ops/cpu/gemm.h"

namespace cnnflow::cpu {
namespace {

// The output columns [lo, hi) whose input column ow * stride + offset lies
// inside [0, w).
void ValidRange(int64_t offset, int64_t stride, int64_t w, int64_t out_w, int64_t* lo,
                int64_t* hi) {
  int64_t l = offset >= 0 ? 0 : CeilDiv(-offset, stride);
  int64_t h = w - offset <= 0 ? 0 : CeilDiv(w - offset, stride);
  l = std::min(l, out_w);
  *lo = l;
  *hi = std::clamp(h, l, out_w);
}

}  // namespace

bool IsShiftable(const Conv2dGeometry& g) {
  return g.stride_h == 1 && g.stride_w == 1 && g.out_w == g.in_w;
}

namespace {

// x: one group of one sample [C/groups, H, W] -> col rows
// ((c * kh + i) * kw + j) of H'*W' entries each. col must be a scratch
// buffer that only this function has written for this geometry (or zeros):
// the padding cells are left as they are.
// Rows are ld apart (ld >= H'*W'; a wider matrix holds several samples).
template <typename T>
void Im2Col(const Conv2dGeometry& g, const Conv2dScratch& plan, const T* x, T* col, int64_t ld) {
  const int64_t ow_n = g.out_w, oh_n = g.out_h;
  const int64_t taps = g.kernel_h * g.kernel_w;
  for (int64_t c = 0; c < g.in_per_group(); ++c) {
    const T* xc = x + c * g.in_plane();
    if (plan.shiftable) {
      for (int64_t k = 0; k < taps; ++k) {
        const TapSpan& t = plan.taps[k];
        T* row = col + (c * taps + k) * ld;
        std::copy(xc + t.p0 + t.shift, xc + t.p1 + t.shift, row + t.p0);
        const int32_t* bp = plan.border.data() + plan.border_begin[k];
        const int32_t* be = plan.border.data() + plan.border_begin[k + 1];
        for (; bp != be; ++bp) row[*bp] = T(0);
      }
      continue;
    }
    for (int64_t i = 0; i < g.kernel_h; ++i) {
      const int64_t ih0 = i * g.dilation_h - g.pad_h;
      for (int64_t j = 0; j < g.kernel_w; ++j) {
        T* row = col + (c * taps + i * g.kernel_w + j) * ld;
        const int64_t iw0 = j * g.dilation_w - g.pad_w;
        int64_t lo, hi;
        ValidRange(iw0, g.stride_w, g.in_w, ow_n, &lo, &hi);
        for (int64_t oh = 0; oh < oh_n; ++oh) {
          const int64_t ih = oh * g.stride_h + ih0;
          if (ih < 0 || ih >= g.in_h) continue;
          const T* in = xc + ih * g.in_w + iw0;
          T* out = row + oh * ow_n;
          if (g.stride_w == 1) {
            std::copy(in + lo, in + hi, out + lo);
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) out[ow] = in[ow * g.stride_w];
          }
        }
      }
    }
  }
}

// The adjoint of Im2Col: dx [C/groups, H, W] (overwritten) = the sum of
// col's rows (layout as above, ld apart) at their input positions. col is
// scratch: its border cells may be zeroed on the way.
template <typename T>
void Col2Im(const Conv2dGeometry& g, const Conv2dScratch& plan, T* col, T* dx, int64_t ld) {
  const int64_t ow_n = g.out_w, oh_n = g.out_h;
  const int64_t taps = g.kernel_h * g.kernel_w;
  for (int64_t c = 0; c < g.in_per_group(); ++c) {
    T* dxc = dx + c * g.in_plane();
    T* col_c = col + c * taps * ld;
    // With "same" padding the centre tap covers the whole plane: copying it
    // first saves zeroing dx.
    if (plan.centre >= 0) {
      std::copy_n(col_c + plan.centre * ld, g.out_plane(), dxc);
    } else {
      std::fill_n(dxc, g.in_plane(), T(0));
    }
    if (plan.shiftable) {
      for (int64_t k = 0; k < taps; ++k) {
        if (k == plan.centre) continue;
        const TapSpan& t = plan.taps[k];
        T* row = col_c + k * ld;
        // Zeroed border cells make the whole span one contiguous add.
        const int32_t* bp = plan.border.data() + plan.border_begin[k];
        const int32_t* be = plan.border.data() + plan.border_begin[k + 1];
        for (; bp != be; ++bp) row[*bp] = T(0);
        T* out = dxc + t.shift;
        for (int64_t p = t.p0; p < t.p1; ++p) out[p] += row[p];
      }
      continue;
    }
    for (int64_t i = 0; i < g.kernel_h; ++i) {
      const int64_t ih0 = i * g.dilation_h - g.pad_h;
      for (int64_t j = 0; j < g.kernel_w; ++j) {
        const T* row = col_c + (i * g.kernel_w + j) * ld;
        const int64_t iw0 = j * g.dilation_w - g.pad_w;
        int64_t lo, hi;
        ValidRange(iw0, g.stride_w, g.in_w, ow_n, &lo, &hi);
        for (int64_t oh = 0; oh < oh_n; ++oh) {
          const int64_t ih = oh * g.stride_h + ih0;
          if (ih < 0 || ih >= g.in_h) continue;
          const T* in = row + oh * ow_n;
          T* out = dxc + ih * g.in_w + iw0;
          if (g.stride_w == 1) {
            for (int64_t ow = lo; ow < hi; ++ow) out[ow] += in[ow];
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) out[ow * g.stride_w] += in[ow];
          }
        }
      }
    }
  }
}

// With few output positions per sample (ResNet-18's 4x4 stage: P = 16)
// per-sample GEMMs are rank-16 updates of dW [K, R] (9.4 MB at 512 -> 512
// channels) and re-read W per sample. There the whole chunk is lowered into
// one GEMM over mb * P columns, at the cost of gathering dY and scattering Y:
// faster in every pass at P = 16, no faster at P = 64, hence P < 64
// (bench/results/2026-12-07-conv-notes.md).
constexpr int64_t kLowerChunkBelow = 64;
bool LowersChunk(const Conv2dGeometry& g) {
  return g.groups == 1 && g.out_plane() < kLowerChunkBelow && !GemmDwTransposed(g);
}

// The col matrix of samples [0, mb) of x side by side: sample i in columns
// [i * P, (i + 1) * P) of rows ld = mb * P apart. Each block is zeroed
// first (Im2Col writes only the cells that depend on x).
template <typename T>
void Im2ColChunk(const Conv2dGeometry& g, const Conv2dScratch& scratch, const T* x, int64_t mb,
                 T* col) {
  const int64_t cols = g.out_plane(), ld = mb * cols, in_sample = g.in_channels * g.in_plane();
  for (int64_t i = 0; i < mb; ++i) {
    for (int64_t r = 0; r < g.col_rows(); ++r) std::fill_n(col + r * ld + i * cols, cols, T(0));
    Im2Col(g, scratch, x + i * in_sample, col + i * cols, ld);
  }
}

// GEMM path of a LowersChunk layer, one chunk of mb samples.
template <typename T>
void LoweredForwardChunk(const Conv2dGeometry& g, Conv2dScratch& scratch, const T* x, const T* w,
                         const T* bias, bool relu, T* y, int64_t mb) {
  const int64_t cols = g.out_plane(), rows = g.col_rows(), k_n = g.out_channels;
  const int64_t ld = mb * cols;
  T* col = GrowBuffer<T>(scratch.wide_col, rows * ld);
  T* yw = GrowBuffer<T>(scratch.wide_y, k_n * ld);
  Im2ColChunk(g, scratch, x, mb, col);
  Gemm<T>(false, false, k_n, ld, rows, T(1), w, rows, col, ld, T(0), yw, ld);
  for (int64_t i = 0; i < mb; ++i) {
    for (int64_t k = 0; k < k_n; ++k) {
      const T* src = yw + k * ld + i * cols;
      T* dst = y + (i * k_n + k) * cols;
      const T b = bias != nullptr ? bias[k] : T(0);
      for (int64_t p = 0; p < cols; ++p) {
        const T v = src[p] + b;
        dst[p] = relu && v < T(0) ? T(0) : v;
      }
    }
  }
}

// Backward of a LowersChunk layer, one chunk of mb samples: adds into pdw
// and pdb (null: skipped), writes dx (null: skipped).
template <typename T>
void LoweredBackwardChunk(const Conv2dGeometry& g, Conv2dScratch& scratch, const T* x, const T* w,
                          const T* dy, T* dx, T* pdw, T* pdb, int64_t mb) {
  const int64_t cols = g.out_plane(), rows = g.col_rows(), k_n = g.out_channels;
  const int64_t ld = mb * cols, in_sample = g.in_channels * g.in_plane();
  T* dyw = GrowBuffer<T>(scratch.wide_y, k_n * ld);
  for (int64_t i = 0; i < mb; ++i) {
    for (int64_t k = 0; k < k_n; ++k) {
      std::copy_n(dy + (i * k_n + k) * cols, cols, dyw + k * ld + i * cols);
    }
  }
  if (pdw != nullptr) {
    T* col = GrowBuffer<T>(scratch.wide_col, rows * ld);
    Im2ColChunk(g, scratch, x, mb, col);
    Gemm<T>(false, true, k_n, rows, ld, T(1), dyw, ld, col, ld, T(1), pdw, rows);
  }
  if (pdb != nullptr) {
    for (int64_t k = 0; k < k_n; ++k) pdb[k] += RowSum(dyw + k * ld, ld);
  }
  if (dx == nullptr) return;
  T* dcol = GrowBuffer<T>(scratch.wide_dcol, rows * ld);
  Gemm<T>(true, false, rows, ld, k_n, T(1), w, rows, dyw, ld, T(0), dcol, ld);
  for (int64_t i = 0; i < mb; ++i) Col2Im(g, scratch, dcol + i * cols, dx + i * in_sample, ld);
}

}  // namespace

template <typename T>
void GemmForwardChunk(const Conv2dGeometry& g, Conv2dScratch& scratch, const T* x, const T* w,
                      const T* bias, bool relu, T* y, int64_t begin, int64_t end) {
  if (LowersChunk(g)) {
    const int64_t in_sample = g.in_channels * g.in_plane();
    const int64_t out_sample = g.out_channels * g.out_plane();
    LoweredForwardChunk(g, scratch, x + begin * in_sample, w, bias, relu, y + begin * out_sample,
                        end - begin);
    return;
  }
  const int64_t cols = g.out_plane(), rows = g.col_rows(), kg = g.out_per_group();
  const int64_t in_group = g.in_per_group() * g.in_plane();
  const bool pointwise = g.is_pointwise();
  T* col = pointwise ? nullptr : ScratchBuffer<T>(scratch.col, rows * cols, true);
  for (int64_t s = begin; s < end; ++s) {
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      const T* src = x + (s * g.groups + grp) * in_group;
      if (!pointwise) {
        Im2Col(g, scratch, src, col, cols);
        src = col;
      }
      T* yg = y + (s * g.groups + grp) * kg * cols;
      if (bias != nullptr) {
        for (int64_t k = 0; k < kg; ++k) std::fill_n(yg + k * cols, cols, bias[grp * kg + k]);
      }
      Gemm<T>(false, false, kg, cols, rows, T(1), w + grp * kg * rows, rows, src, cols,
              bias != nullptr ? T(1) : T(0), yg, cols);
      if (relu) ReluInPlace(yg, kg * cols);  // while it is in cache
    }
  }
}

// With few col rows (conv1: R = 9, Kg = 32) the GEMM is faster producing
// dW^T[R, Kg] (bench/results/2026-12-07-conv-notes.md); the chunk sum
// transposes it back.
bool GemmDwTransposed(const Conv2dGeometry& g) { return g.col_rows() < g.out_per_group(); }

template <typename T>
void GemmBackwardChunk(const Conv2dGeometry& g, Conv2dScratch& scratch, const T* x, const T* w,
                       const T* dy, T* dx, T* pdw, T* pdb, int64_t begin, int64_t end) {
  if (LowersChunk(g)) {
    const int64_t in_sample = g.in_channels * g.in_plane();
    const int64_t out_sample = g.out_channels * g.out_plane();
    LoweredBackwardChunk(g, scratch, pdw != nullptr ? x + begin * in_sample : nullptr, w,
                         dy + begin * out_sample, dx != nullptr ? dx + begin * in_sample : nullptr,
                         pdw, pdb, end - begin);
    return;
  }
  const int64_t cols = g.out_plane(), rows = g.col_rows(), kg = g.out_per_group();
  const int64_t in_group = g.in_per_group() * g.in_plane();
  const bool pointwise = g.is_pointwise();
  const bool dw_transposed = GemmDwTransposed(g);
  T* col = nullptr;
  T* dcol = nullptr;
  if (!pointwise) {
    if (pdw != nullptr) col = ScratchBuffer<T>(scratch.col, rows * cols, true);
    if (dx != nullptr) dcol = ScratchBuffer<T>(scratch.dcol, rows * cols, false);
  }
  for (int64_t s = begin; s < end; ++s) {
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      const T* dyg = dy + (s * g.groups + grp) * kg * cols;
      if (pdw != nullptr) {
        const T* src = x + (s * g.groups + grp) * in_group;
        if (!pointwise) {
          Im2Col(g, scratch, src, col, cols);
          src = col;
        }
        if (dw_transposed) {
          Gemm<T>(false, true, rows, kg, cols, T(1), src, cols, dyg, cols, T(1),
                  pdw + grp * kg * rows, kg);
        } else {
          Gemm<T>(false, true, kg, rows, cols, T(1), dyg, cols, src, cols, T(1),
                  pdw + grp * kg * rows, rows);
        }
      }
      if (dx == nullptr) continue;
      const T* wg = w + grp * kg * rows;
      T* dxg = dx + (s * g.groups + grp) * in_group;
      if (pointwise) {
        Gemm<T>(true, false, rows, cols, kg, T(1), wg, rows, dyg, cols, T(0), dxg, cols);
        continue;
      }
      Gemm<T>(true, false, rows, cols, kg, T(1), wg, rows, dyg, cols, T(0), dcol, cols);
      Col2Im(g, scratch, dcol, dxg, cols);
    }
    if (pdb != nullptr) {
      const T* dys = dy + s * g.out_channels * cols;
      for (int64_t k = 0; k < g.out_channels; ++k) pdb[k] += RowSum(dys + k * cols, cols);
    }
  }
}

template void GemmForwardChunk<float>(const Conv2dGeometry&, Conv2dScratch&, const float*,
                                      const float*, const float*, bool, float*, int64_t, int64_t);
template void GemmForwardChunk<double>(const Conv2dGeometry&, Conv2dScratch&, const double*,
                                       const double*, const double*, bool, double*, int64_t,
                                       int64_t);
template void GemmBackwardChunk<float>(const Conv2dGeometry&, Conv2dScratch&, const float*,
                                       const float*, const float*, float*, float*, float*, int64_t,
                                       int64_t);
template void GemmBackwardChunk<double>(const Conv2dGeometry&, Conv2dScratch&, const double*,
                                        const double*, const double*, double*, double*, double*,
                                        int64_t, int64_t);

void Im2ColTransposed(const Conv2dGeometry& g, int64_t mb, const uint16_t* xb, uint16_t* col) {
  const int64_t plane = g.out_plane(), q_total = mb * plane;
  // Stride 1 and W' == W: a tap's plane is the input plane shifted by one
  // offset, its out-of-range columns zeroed (one copy per sample).
  const bool shift = g.stride_h == 1 && g.stride_w == 1 && g.out_w == g.in_w;
  for (int64_t c = 0; c < g.in_channels; ++c) {
    for (int64_t i = 0; i < g.kernel_h; ++i) {
      const int64_t ih0 = i * g.dilation_h - g.pad_h;
      for (int64_t j = 0; j < g.kernel_w; ++j) {
        uint16_t* out = col + ((c * g.kernel_h + i) * g.kernel_w + j) * q_total;
        const int64_t iw0 = j * g.dilation_w - g.pad_w;
        // Output columns [lo, hi) whose input column lies inside [0, W).
        int64_t lo = iw0 >= 0 ? 0 : (-iw0 + g.stride_w - 1) / g.stride_w;
        int64_t hi = g.in_w - iw0 <= 0 ? 0 : (g.in_w - iw0 + g.stride_w - 1) / g.stride_w;
        lo = std::min(lo, g.out_w);
        hi = std::clamp(hi, lo, g.out_w);
        for (int64_t s = 0; s < mb; ++s, out += plane) {
          const uint16_t* xc = xb + (s * g.in_channels + c) * g.in_plane();
          if (shift) {
            // Rows [oh_lo, oh_hi) read input rows inside [0, H).
            const int64_t oh_lo = std::clamp<int64_t>(-ih0, 0, g.out_h);
            const int64_t oh_hi = std::clamp<int64_t>(g.in_h - ih0, oh_lo, g.out_h);
            const int64_t t0 = oh_lo * g.out_w + lo, t1 = (oh_hi - 1) * g.out_w + hi;
            if (oh_lo == oh_hi || lo == hi) {
              std::fill_n(out, plane, uint16_t{0});
              continue;
            }
            std::fill_n(out, t0, uint16_t{0});
            std::copy_n(xc + t0 + ih0 * g.in_w + iw0, t1 - t0, out + t0);
            std::fill_n(out + t1, plane - t1, uint16_t{0});
            for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {  // the wrapped columns
              uint16_t* r = out + oh * g.out_w;
              if (oh > oh_lo) std::fill_n(r, lo, uint16_t{0});
              if (oh + 1 < oh_hi) std::fill_n(r + hi, g.out_w - hi, uint16_t{0});
            }
            continue;
          }
          for (int64_t oh = 0; oh < g.out_h; ++oh) {
            uint16_t* r = out + oh * g.out_w;
            const int64_t ih = oh * g.stride_h + ih0;
            if (ih < 0 || ih >= g.in_h) {
              std::fill_n(r, g.out_w, uint16_t{0});
              continue;
            }
            std::fill_n(r, lo, uint16_t{0});
            std::fill_n(r + hi, g.out_w - hi, uint16_t{0});
            const uint16_t* xr = xc + ih * g.in_w + iw0;
            for (int64_t ow = lo; ow < hi; ++ow) r[ow] = xr[ow * g.stride_w];
          }
        }
      }
    }
  }
}

void Im2ColNhwc(const Conv2dGeometry& g, int64_t mb, const uint16_t* xb, uint16_t* col) {
  const int64_t c_n = g.in_channels, ncol = g.col_rows();
  for (int64_t s = 0; s < mb; ++s) {
    const uint16_t* xs = xb + s * g.in_plane() * c_n;
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        uint16_t* row = col + ((s * g.out_h + oh) * g.out_w + ow) * ncol;
        for (int64_t i = 0; i < g.kernel_h; ++i) {
          const int64_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
          for (int64_t j = 0; j < g.kernel_w; ++j, row += c_n) {
            const int64_t iw = ow * g.stride_w - g.pad_w + j * g.dilation_w;
            if (ih < 0 || ih >= g.in_h || iw < 0 || iw >= g.in_w) {
              std::fill_n(row, c_n, uint16_t{0});
            } else {
              std::copy_n(xs + (ih * g.in_w + iw) * c_n, c_n, row);
            }
          }
        }
      }
    }
  }
}

}  // namespace cnnflow::cpu
