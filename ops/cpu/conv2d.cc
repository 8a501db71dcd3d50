// CPU kernels of conv2d: im2col + GEMM (oneDNN's sgemm, ops/cpu/gemm.h) or
// oneDNN's convolution primitives, parallel over the batch.
//
// Per sample and group g (Kg = K/groups output channels, R = C/groups*kh*kw
// rows of the im2col matrix, P = H'*W' columns):
//   forward   Y_g[Kg, P]   = W_g[Kg, R] * col(X_g)[R, P]  (+ bias: Y starts as it)
//   backward  dW_g[Kg, R] += dY_g[Kg, P] * col(X_g)^T[P, R]
//             dX_g          = col2im(W_g^T[R, Kg] * dY_g[Kg, P])
// The batch is cut into ForChunks chunks (a count that depends on the shape
// only); dW and dbias are summed per chunk, then over chunks in order, so
// results are bitwise the same for any thread count. Pointwise convs (1x1, stride
// 1, no padding) skip im2col: the input is the col matrix.
//
// Measured (batch 64, 32->64 3x3 on 14x14, one core): lowering several
// samples into one wider GEMM was no faster with OpenBLAS at these sizes
// and costs a scatter of Y and a gather of dY, so each GEMM is per sample.
// What did pay: for stride 1 with W' == W (every "same" conv) a col row is
// one contiguous span of the input (one copy instead of a copy per output
// row), col buffers that stay zeroed where the padding is, and col2im that
// starts from the centre tap instead of a zeroed dx.
//
// f32 layers also have oneDNN's convolution primitives (ops/cpu/conv/onednn_conv.h),
// run per chunk on one thread each, like the GEMMs. `algo: auto` picks,
// separately for forward, backward-data and backward-weights, whichever runs
// a chunk of this shape faster, measured once per shape on this machine and
// remembered (ops/cpu/conv/pick_cache.h). Measured on one AVX2 Zen3 core
// (GFLOP/s, GEMM / oneDNN, ResNet-18's 3x3 convs at chunks of 4): forward
// 36-94 / 59-89, backward-data 69-88 / 78-100, backward-weights 60-85 /
// 56-69; so oneDNN takes most backward-data passes and the GEMMs most
// backward-weights passes; where C is tiny (Fashion-MNIST's conv1) the GEMMs
// run backward 4-6x faster and forward is even.
#include "ops/layers/conv2d.h"

#include <tbb/enumerable_thread_specific.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/cpu/conv/onednn_conv.h"
#include "ops/cpu/conv/pick_cache.h"
#include "ops/cpu/elementwise.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/onednn.h"
#include "ops/cpu/parallel.h"
#include "ops/random.h"

namespace cnnflow {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Forward chunks: a function of the batch size only (determinism).
int64_t BatchChunks(int64_t n) { return cpu::NumChunks(n, 1); }

// Backward chunks: each sums its own dW, and the partial sums are added
// after (chunks x |dW| of memory traffic). A chunk gets at least
// kMinChunkPositions output positions, so that traffic stays under ~1% of
// the FLOPs' time: ResNet-18's 4x4 stage gets 2 chunks at batch 64, the
// 32x32 stage 16. Still a function of the shape only.
constexpr int64_t kMinChunkPositions = 400;
int64_t BackwardChunks(const Conv2dGeometry& g, int64_t n) {
  return cpu::NumChunks(n, CeilDiv(kMinChunkPositions, g.out_plane()));
}

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

// For stride 1 with W' == W ("same" width), output position p = oh * W + ow
// of tap (i, j) reads input p + shift, shift = ih0 * W + iw0: a col row is
// one contiguous span of the input plane, except for the border columns
// (ow + iw0 outside [0, W)), where the span holds wrapped values of the
// neighbouring input row that must be zeroed.
bool IsShiftable(const Conv2dGeometry& g) {
  return g.stride_h == 1 && g.stride_w == 1 && g.out_w == g.in_w;
}

// One tap's valid span [p0, p1) of a shiftable geometry (outside it the
// col row is always zero), and its offset into the input plane.
struct TapSpan {
  int64_t p0, p1, shift;
};

}  // namespace

// The CPU kernels' state of one layer: what Build precomputes from the
// geometry, and per-thread scratch kept for the layer's life.
struct Conv2dScratch {
  explicit Conv2dScratch(const Conv2dGeometry& g);

  bool shiftable = false;
  std::vector<TapSpan> taps;         // shiftable: per tap (i * kw + j)
  std::vector<int32_t> border;       // shiftable: per tap, its border positions p in [p0, p1)
  std::vector<size_t> border_begin;  // tap t's positions: [border_begin[t], border_begin[t + 1])
  int64_t centre = -1;               // a tap whose span is the whole plane (shift 0), or -1
  // Per thread: the im2col matrix of one sample [R, P]. Zeroed once: the
  // padding cells are the same for every sample, so Im2Col only rewrites
  // the entries that depend on x. dcol receives W^T dY before col2im.
  tbb::enumerable_thread_specific<Tensor> col, dcol;
  // Backward's per-chunk partial sums of dW and dbias, kept between steps.
  Tensor partial;
  // Per thread, with a fused ReLU: one backward chunk's dy masked by y > 0.
  tbb::enumerable_thread_specific<Tensor> masked;
  // Per thread, layers that lower a whole chunk (LowersChunk): its col
  // matrix [R, mb * P], W^T dY of it, and Y or dY of it [K, mb * P].
  tbb::enumerable_thread_specific<Tensor> wide_col, wide_dcol, wide_y;

  // The algorithm picks by batch size, and oneDNN's primitives by chunk
  // size. Guarded: one layer may be planned from two threads (pipelines).
  std::mutex mu;
  bool bf16 = false;  // Conv2d::ComputeInBf16: oneDNN's bf16 primitives for every pass
  // Conv2d::SetChannelsLast: x and dx, y and dy channels-last.
  bool nhwc_in = false, nhwc_out = false;
  std::map<int64_t, Conv2dPlan> plans;
  // By chunk size and Conv2dPlan::f32_kernels.
  std::map<std::pair<int64_t, bool>, std::unique_ptr<cpu::OnednnConv>> onednn;

  // bf16: x in bf16 NHWC as a training forward converted it, for the
  // backward-weights of the same x, which then need not convert it again.
  // Keyed by x's data, so that micro-batches in flight keep one each; at
  // most kMaxKept at once (the oldest goes: its backward converts x itself).
  static constexpr size_t kMaxKept = 8;
  std::mutex kept_mu;
  std::vector<std::pair<const void*, Tensor>> kept;  // oldest first
  // A buffer of `count` bf16 values kept for x (replacing x's old one).
  uint16_t* Keep(const void* x, int64_t count) {
    Tensor t = Tensor::Empty({(count + 1) / 2});
    auto* data = static_cast<uint16_t*>(t.raw_data());
    std::lock_guard<std::mutex> lock(kept_mu);
    std::erase_if(kept, [x](const auto& e) { return e.first == x; });
    if (kept.size() >= kMaxKept) kept.erase(kept.begin());
    kept.emplace_back(x, std::move(t));
    return data;
  }
  // x's kept buffer, taken out of the list (undefined when there is none).
  Tensor Take(const void* x) {
    std::lock_guard<std::mutex> lock(kept_mu);
    for (auto it = kept.begin(); it != kept.end(); ++it) {
      if (it->first == x) {
        Tensor t = std::move(it->second);
        kept.erase(it);
        return t;
      }
    }
    return Tensor();
  }
};

Conv2dScratch::Conv2dScratch(const Conv2dGeometry& g) : shiftable(IsShiftable(g)) {
  if (!shiftable) return;
  border_begin.push_back(0);
  for (int64_t i = 0; i < g.kernel_h; ++i) {
    const int64_t ih0 = i * g.dilation_h - g.pad_h;
    const int64_t oh_lo = std::clamp<int64_t>(-ih0, 0, g.out_h);
    const int64_t oh_hi = std::clamp<int64_t>(g.in_h - ih0, oh_lo, g.out_h);
    for (int64_t j = 0; j < g.kernel_w; ++j) {
      const int64_t iw0 = j * g.dilation_w - g.pad_w;
      TapSpan t;
      t.shift = ih0 * g.in_w + iw0;
      t.p0 = std::max(oh_lo * g.out_w, -t.shift);
      t.p1 = std::max(t.p0, std::min(oh_hi * g.out_w, g.in_plane() - t.shift));
      for (int64_t p = t.p0; p < t.p1; ++p) {
        const int64_t iw = p % g.out_w + iw0;
        if (iw < 0 || iw >= g.in_w) border.push_back(static_cast<int32_t>(p));
      }
      border_begin.push_back(border.size());
      if (t.shift == 0 && t.p0 == 0 && t.p1 == g.out_plane() && g.out_h == g.in_h) {
        centre = static_cast<int64_t>(taps.size());
      }
      taps.push_back(t);
    }
  }
}

namespace {

template <typename T>
T* ScratchBuffer(tbb::enumerable_thread_specific<Tensor>& ets, int64_t size, bool zeroed) {
  Tensor& t = ets.local();
  if (!t.defined() || t.dtype() != DTypeOf<T>() || t.numel() != size) {
    t = zeroed ? Tensor::Zeros({size}, DTypeOf<T>()) : Tensor::Empty({size}, DTypeOf<T>());
  }
  return t.data<T>();
}

// A buffer of at least `size` elements (its contents undefined), kept.
template <typename T>
T* GrowBuffer(tbb::enumerable_thread_specific<Tensor>& ets, int64_t size) {
  Tensor& t = ets.local();
  if (!t.defined() || t.dtype() != DTypeOf<T>() || t.numel() < size) {
    t = Tensor::Empty({size}, DTypeOf<T>());
  }
  return t.data<T>();
}

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
// one GEMM over mb * P columns, at the cost of gathering dY and scattering Y.
// Measured with oneDNN's sgemm on one Zen3 core (GFLOP/s, per sample / one
// GEMM for 32 samples): P = 16, 512 -> 512: backward-weights 65 / 87,
// backward-data 68 / 86, forward 82 / 83; at P = 64 (256 -> 256, 16
// samples) one GEMM is no faster (78 / 73 backward-weights), hence P < 64.
constexpr int64_t kLowerChunkBelow = 64;
bool GemmDwTransposed(const Conv2dGeometry& g);
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
  cpu::Gemm<T>(false, false, k_n, ld, rows, T(1), w, rows, col, ld, T(0), yw, ld);
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
    cpu::Gemm<T>(false, true, k_n, rows, ld, T(1), dyw, ld, col, ld, T(1), pdw, rows);
  }
  if (pdb != nullptr) {
    for (int64_t k = 0; k < k_n; ++k) pdb[k] += RowSum(dyw + k * ld, ld);
  }
  if (dx == nullptr) return;
  T* dcol = GrowBuffer<T>(scratch.wide_dcol, rows * ld);
  cpu::Gemm<T>(true, false, rows, ld, k_n, T(1), w, rows, dyw, ld, T(0), dcol, ld);
  for (int64_t i = 0; i < mb; ++i) Col2Im(g, scratch, dcol + i * cols, dx + i * in_sample, ld);
}

// GEMM path, samples [begin, end): x [n, C, H, W], w [K, C/groups, kh, kw],
// bias [K] or null -> y [n, K, H', W'].
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
      cpu::Gemm<T>(false, false, kg, cols, rows, T(1), w + grp * kg * rows, rows, src, cols,
                   bias != nullptr ? T(1) : T(0), yg, cols);
      if (relu) ReluInPlace(yg, kg * cols);  // while it is in cache
    }
  }
}

// With few col rows (conv1: R = 9, Kg = 32) the GEMM is faster producing
// dW^T[R, Kg] (measured 2x with oneDNN's sgemm); the chunk sum transposes
// it back.
bool GemmDwTransposed(const Conv2dGeometry& g) { return g.col_rows() < g.out_per_group(); }

// GEMM path, samples [begin, end) of x, w, dy: adds into pdw (dW of the
// chunk, transposed per group when GemmDwTransposed; null: skipped) and pdb
// (null: skipped); writes dx [n, C, H, W] (null: skipped).
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
          cpu::Gemm<T>(false, true, rows, kg, cols, T(1), src, cols, dyg, cols, T(1),
                       pdw + grp * kg * rows, kg);
        } else {
          cpu::Gemm<T>(false, true, kg, rows, cols, T(1), dyg, cols, src, cols, T(1),
                       pdw + grp * kg * rows, rows);
        }
      }
      if (dx == nullptr) continue;
      const T* wg = w + grp * kg * rows;
      T* dxg = dx + (s * g.groups + grp) * in_group;
      if (pointwise) {
        cpu::Gemm<T>(true, false, rows, cols, kg, T(1), wg, rows, dyg, cols, T(0), dxg, cols);
        continue;
      }
      cpu::Gemm<T>(true, false, rows, cols, kg, T(1), wg, rows, dyg, cols, T(0), dcol, cols);
      Col2Im(g, scratch, dcol, dxg, cols);
    }
    if (pdb != nullptr) {
      const T* dys = dy + s * g.out_channels * cols;
      for (int64_t k = 0; k < g.out_channels; ++k) pdb[k] += RowSum(dys + k * cols, cols);
    }
  }
}

// The oneDNN convolution for chunks of mb samples (made on first use).
cpu::OnednnConv& OnednnFor(const Conv2dGeometry& g, bool bias, bool relu, bool f32_kernels,
                           Conv2dScratch& scratch, int64_t mb) {
  std::lock_guard<std::mutex> lock(scratch.mu);
  auto& conv = scratch.onednn[{mb, f32_kernels}];
  if (conv == nullptr) {
    conv = std::make_unique<cpu::OnednnConv>(g, mb, bias, relu, scratch.bf16, scratch.nhwc_in,
                                             scratch.nhwc_out, f32_kernels);
  }
  return *conv;
}

// The oneDNN convolutions of the chunks of n samples cut in `chunks`:
// ForChunks' chunks hold n / chunks samples, or one more.
struct ChunkConvs {
  int64_t small = 0;
  cpu::OnednnConv* conv[2] = {nullptr, nullptr};  // small, small + 1 samples

  cpu::OnednnConv& For(int64_t mb) const { return *conv[mb - small]; }
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (cpu::OnednnConv* c : conv)
      if (c != nullptr) fn(*c);
  }
};
ChunkConvs OnednnChunks(const Conv2dGeometry& g, const Conv2dPlan& plan, bool bias, bool relu,
                        Conv2dScratch& scratch, int64_t n, int64_t chunks) {
  ChunkConvs convs;
  convs.small = n / chunks;
  convs.conv[0] = &OnednnFor(g, bias, relu, plan.f32_kernels, scratch, convs.small);
  if (n % chunks != 0) {
    convs.conv[1] = &OnednnFor(g, bias, relu, plan.f32_kernels, scratch, convs.small + 1);
  }
  return convs;
}

// x [n, C, H, W], w [K, C/groups, kh, kw], bias [K] or null -> y [n, K, H', W'].
// relu: y = max(conv, 0) (a fused ReLU). keep: a backward of this x follows
// (scratch.Keep it where its backward-weights can read it). x_bf16: x given
// in bf16 NHWC instead (Conv2d::ReadsBf16; x null).
template <typename T>
void ConvForward(const Conv2dGeometry& g, const Conv2dPlan& plan, const T* x, const T* w,
                 const T* bias, bool relu, T* y, int64_t n, Conv2dScratch& scratch,
                 bool keep = false, const uint16_t* x_bf16 = nullptr) {
  if (n == 0) return;
  const int64_t chunks = BatchChunks(n);
  CNNFLOW_ENFORCE(x_bf16 == nullptr || plan.forward == ConvAlgo::kOnednn,
                  "conv2d: a bf16 input outside the bf16 kernels");
  if constexpr (std::is_same_v<T, float>) {
    if (plan.forward == ConvAlgo::kOnednn) {
      const ChunkConvs convs = OnednnChunks(g, plan, bias != nullptr, relu, scratch, n, chunks);
      // The matmul backward-weights reads the kept x too, from NHWC. A bf16
      // x is read as it is by both.
      bool keeps = keep && x_bf16 == nullptr &&
                   (plan.backward_weights == ConvAlgo::kOnednn ||
                    (scratch.nhwc_in && plan.backward_weights == ConvAlgo::kMatmul));
      convs.ForEach([&](cpu::OnednnConv& c) {
        c.PrepareForwardWeights(w);
        keeps = keeps && c.KeepsInput(plan.backward_weights);
      });
      const int64_t in_sample = g.in_channels * g.in_plane();
      const int64_t out_sample = g.out_channels * g.out_plane();
      uint16_t* kept = keeps ? scratch.Keep(x, n * in_sample) : nullptr;
      cpu::ForChunks(n, chunks, [&](int64_t, int64_t begin, int64_t end) {
        convs.For(end - begin)
            .Forward(x_bf16 != nullptr ? nullptr : x + begin * in_sample, bias,
                     y + begin * out_sample, kept != nullptr ? kept + begin * in_sample : nullptr,
                     x_bf16 != nullptr ? x_bf16 + begin * in_sample : nullptr);
      });
      return;
    }
  }
  cpu::ForChunks(n, chunks, [&](int64_t, int64_t begin, int64_t end) {
    GemmForwardChunk(g, scratch, x, w, bias, relu, y, begin, end);
  });
}

// x [n, C, H, W], w [K, C/groups, kh, kw], dy [n, K, H', W'] ->
// dx [n, C, H, W] (overwritten; null: skipped), dw [K, C/groups, kh, kw] and
// db [K] (added into; db null: no bias; dw null: neither, and x unused). With a fused ReLU (relu_y:
// the layer's output y), dy is the gradient of max(conv, 0) and each chunk first masks it by y > 0.
// x_bf16, dy_bf16: x, dy given in bf16 NHWC instead (Conv2d::ReadsBf16,
// ReadsBf16Grad; x, dy null).
template <typename T>
void ConvBackward(const Conv2dGeometry& g, const Conv2dPlan& plan, const T* x, const T* w,
                  const T* relu_y, const T* dy, T* dx, T* dw, T* db, int64_t n,
                  Conv2dScratch& scratch, const uint16_t* x_bf16 = nullptr,
                  const uint16_t* dy_bf16 = nullptr) {
  if (n == 0) return;
  const int64_t chunks = BackwardChunks(g, n);
  const int64_t dw_size = g.out_channels * g.col_rows();
  const int64_t part_size = dw_size + g.out_channels;  // dW then dbias, per chunk
  const bool flipped_data = std::is_same_v<T, float> && plan.backward_data == ConvAlgo::kFlipped;
  const bool onednn_data =
      flipped_data || (std::is_same_v<T, float> && plan.backward_data == ConvAlgo::kOnednn);
  const bool want_dw = dw != nullptr;
  if (!want_dw) db = nullptr;
  const bool matmul_weights =
      want_dw && std::is_same_v<T, float> && plan.backward_weights == ConvAlgo::kMatmul;
  const bool onednn_weights = matmul_weights || (want_dw && std::is_same_v<T, float> &&
                                                 plan.backward_weights == ConvAlgo::kOnednn);
  const bool dw_transposed = !onednn_weights && GemmDwTransposed(g);
  if (want_dw && (!scratch.partial.defined() || scratch.partial.dtype() != DTypeOf<T>() ||
                  scratch.partial.numel() < chunks * part_size)) {
    scratch.partial = Tensor::Empty({chunks * part_size}, DTypeOf<T>());
  }
  T* partial = want_dw ? scratch.partial.data<T>() : nullptr;
  CNNFLOW_ENFORCE(x_bf16 == nullptr || !want_dw || onednn_weights,
                  "conv2d: a bf16 input outside the bf16 kernels");
  CNNFLOW_ENFORCE(dy_bf16 == nullptr || ((!want_dw || onednn_weights) &&
                                         (dx == nullptr || onednn_data) && relu_y == nullptr),
                  "conv2d: a bf16 gradient outside the bf16 kernels");
  // x as the forward kept it in bf16 (Conv2dScratch::Keep), if it did.
  const Tensor kept =
      want_dw && x_bf16 == nullptr && onednn_weights && (!matmul_weights || scratch.nhwc_in)
          ? scratch.Take(x)
          : Tensor();
  const auto* x16 = x_bf16 != nullptr ? x_bf16 : static_cast<const uint16_t*>(kept.raw_data());
  ChunkConvs convs;
  if constexpr (std::is_same_v<T, float>) {
    if (onednn_data || onednn_weights) {
      convs = OnednnChunks(g, plan, db != nullptr, relu_y != nullptr, scratch, n, chunks);
      if (onednn_data && dx != nullptr) {
        convs.ForEach([&](cpu::OnednnConv& c) {
          if (flipped_data) {
            c.PrepareFlippedWeights(w);
          } else {
            c.PrepareBackwardWeights(w);
          }
        });
      }
    }
  }
  const int64_t in_sample = g.in_channels * g.in_plane();
  const int64_t out_sample = g.out_channels * g.out_plane();
  const int64_t max_chunk = CeilDiv(n, chunks);

  cpu::ForChunks(n, chunks, [&](int64_t chunk, int64_t begin, int64_t end) {
    T* pdw = want_dw ? partial + chunk * part_size : nullptr;
    T* pdb = db != nullptr ? pdw + dw_size : nullptr;
    const int64_t count = end - begin;
    const T* xc = want_dw && x != nullptr ? x + begin * in_sample : nullptr;
    const T* dyc = dy != nullptr ? dy + begin * out_sample : nullptr;
    T* dxc = dx != nullptr ? dx + begin * in_sample : nullptr;
    if (relu_y != nullptr) {
      T* masked = ScratchBuffer<T>(scratch.masked, max_chunk * out_sample, false);
      ReluMask(relu_y + begin * out_sample, dyc, masked, count * out_sample);
      dyc = masked;
    }
    if constexpr (std::is_same_v<T, float>) {
      if (onednn_weights || (onednn_data && dxc != nullptr)) {
        const uint16_t* kept_x = x16 != nullptr ? x16 + begin * in_sample : nullptr;
        convs.For(count).Backward(xc, kept_x, dyc, onednn_data ? dxc : nullptr, plan.backward_data,
                                  onednn_weights ? pdw : nullptr, pdb, plan.backward_weights,
                                  dy_bf16 != nullptr ? dy_bf16 + begin * out_sample : nullptr);
      }
    }
    if (want_dw && !onednn_weights) std::fill_n(pdw, db != nullptr ? part_size : dw_size, T(0));
    // What the oneDNN passes left (a lowered chunk would copy dy even with nothing to do).
    if ((dxc != nullptr && !onednn_data) || (want_dw && !onednn_weights)) {
      GemmBackwardChunk(g, scratch, xc, w, dyc, onednn_data ? nullptr : dxc,
                        onednn_weights ? nullptr : pdw, onednn_weights ? nullptr : pdb, 0, count);
    }
  });
  if (!want_dw) return;

  // Partial sums in chunk order, then added into the gradients.
  const int64_t total = db != nullptr ? part_size : dw_size;
  const int64_t rows = g.col_rows(), kg = g.out_per_group();
  if (dw_transposed) {
    cpu::ParallelFor(total, 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        int64_t j = i;  // where element i of dW (or dbias) sits in a partial buffer
        if (i < dw_size) {
          const int64_t grp = i / (kg * rows), k = i / rows % kg, r = i % rows;
          j = (grp * rows + r) * kg + k;
        }
        T s = partial[j];
        for (int64_t c = 1; c < chunks; ++c) s += partial[c * part_size + j];
        if (i < dw_size) {
          dw[i] += s;
        } else {
          db[i - dw_size] += s;
        }
      }
    });
    return;
  }
  // The same sums over contiguous blocks, a chunk at a time: loops that
  // vectorise and stream each partial buffer (the per-element loop above
  // was ~5% of a bf16 ResNet-18 step).
  cpu::ParallelFor(total, 4096, [&](int64_t b, int64_t e) {
    constexpr int64_t kBlock = 512;
    T s[kBlock];
    for (int64_t i0 = b, len = 0; i0 < e; i0 += len) {
      // Never across the dW / dbias boundary.
      len = std::min({kBlock, e - i0, i0 < dw_size ? dw_size - i0 : total - i0});
      std::copy_n(partial + i0, len, s);
      for (int64_t c = 1; c < chunks; ++c) {
        const T* p = partial + c * part_size + i0;
        for (int64_t k = 0; k < len; ++k) s[k] += p[k];
      }
      T* out = i0 < dw_size ? dw + i0 : db + (i0 - dw_size);
      for (int64_t k = 0; k < len; ++k) out[k] += s[k];
    }
  });
}

// Seconds of the fastest of a few runs of fn (after one untimed run).
template <typename Fn>
double BestSeconds(Fn&& fn) {
  using Clock = std::chrono::steady_clock;
  fn();
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// size f32 values, uniform in [-1, 1): the data kernels are timed on.
Tensor RandomF32(Rng& rng, int64_t size) {
  Tensor t = Tensor::Empty({size});
  float* p = t.data<float>();
  for (int64_t i = 0; i < size; ++i) p[i] = static_cast<float>(rng.Uniform(-1, 1));
  return t;
}

// Times one chunk of each pass on this thread with both algorithms, on
// random data: "forward,backward_data,backward_weights" with gemm|onednn
// each, then the measured rates in parentheses. oneDNN must win by kMargin
// to be picked (a tie keeps the GEMM path).
constexpr double kMargin = 1.03;
std::string MeasurePicks(const Conv2dGeometry& g, bool has_bias, Conv2dScratch& scratch,
                         int64_t fwd_mb, int64_t bwd_mb) {
  std::unique_ptr<cpu::OnednnConv> fwd_conv, bwd_conv;
  try {
    fwd_conv = std::make_unique<cpu::OnednnConv>(g, fwd_mb, has_bias);
    bwd_conv = fwd_mb == bwd_mb ? nullptr : std::make_unique<cpu::OnednnConv>(g, bwd_mb, has_bias);
  } catch (const Error&) {
    return "gemm,gemm,gemm";  // oneDNN has no primitive for this geometry
  }
  cpu::OnednnConv& bconv = bwd_conv != nullptr ? *bwd_conv : *fwd_conv;
  const int64_t mb = std::max(fwd_mb, bwd_mb);
  Rng rng(1);
  auto random = [&](int64_t size) { return RandomF32(rng, size); };
  const int64_t dw_size = g.out_channels * g.col_rows();
  Tensor x = random(mb * g.in_channels * g.in_plane()), dx = random(x.numel());
  Tensor y = random(mb * g.out_channels * g.out_plane()), dy = random(y.numel());
  Tensor w = random(dw_size), b = random(g.out_channels);
  Tensor dw = random(dw_size + g.out_channels);
  const float* bias = has_bias ? b.data<float>() : nullptr;
  float* db = has_bias ? dw.data<float>() + dw_size : nullptr;
  fwd_conv->PrepareForwardWeights(w.data<float>());
  bconv.PrepareBackwardWeights(w.data<float>());
  auto pick = [](double gemm, double onednn) {
    return gemm > kMargin * onednn ? "onednn" : "gemm";
  };

  const double f_gemm = BestSeconds([&] {
    GemmForwardChunk<float>(g, scratch, x.data<float>(), w.data<float>(), bias, false,
                            y.data<float>(), 0, fwd_mb);
  });
  const double f_onednn =
      BestSeconds([&] { fwd_conv->Forward(x.data<float>(), bias, y.data<float>()); });
  const double d_gemm = BestSeconds([&] {
    GemmBackwardChunk<float>(g, scratch, x.data<float>(), w.data<float>(), dy.data<float>(),
                             dx.data<float>(), nullptr, nullptr, 0, bwd_mb);
  });
  const double d_onednn =
      BestSeconds([&] { bconv.BackwardData(dy.data<float>(), dx.data<float>()); });
  const double w_gemm = BestSeconds([&] {
    GemmBackwardChunk<float>(g, scratch, x.data<float>(), w.data<float>(), dy.data<float>(),
                             nullptr, dw.data<float>(), db, 0, bwd_mb);
  });
  const double w_onednn = BestSeconds(
      [&] { bconv.BackwardWeights(x.data<float>(), dy.data<float>(), dw.data<float>(), db); });
  // The rates go along in the file, so a reader sees why.
  const double f_flop = 2.0 * g.out_channels * g.col_rows() * g.out_plane() / 1e9;
  auto rates = [&](int64_t mb, double gemm, double onednn) {
    return StrCat(static_cast<int>(f_flop * mb / gemm), "/",
                  static_cast<int>(f_flop * mb / onednn));
  };
  return StrCat(pick(f_gemm, f_onednn), ",", pick(d_gemm, d_onednn), ",", pick(w_gemm, w_onednn),
                " (GFLOP/s of one thread, gemm/onednn: forward ", rates(fwd_mb, f_gemm, f_onednn),
                ", backward-data ", rates(bwd_mb, d_gemm, d_onednn), ", backward-weights ",
                rates(bwd_mb, w_gemm, w_onednn), "; oneDNN's ", fwd_conv->ImplInfo(), ")");
}

// One OnednnConv's passes on one chunk: its forward, the faster of its
// backward-data primitive and the flipped forward, and the faster of its
// backward-weights primitive and the matmul (where it has them).
struct OnednnPassTimes {
  std::string data = "onednn", weights = "onednn", rates;
  double seconds = 0;  // the three passes as picked
};
OnednnPassTimes TimeOnednnPasses(cpu::OnednnConv& conv, const Conv2dGeometry& g, bool has_bias,
                                 int64_t mb) {
  Rng rng(1);
  auto random = [&](int64_t size) { return RandomF32(rng, size); };
  const int64_t dw_size = g.out_channels * g.col_rows();
  Tensor x = random(mb * g.in_channels * g.in_plane()), dx = random(x.numel());
  Tensor y = random(mb * g.out_channels * g.out_plane()), dy = random(y.numel());
  Tensor w = random(dw_size), b = random(g.out_channels), dw = random(dw_size + g.out_channels);
  const float* bias = has_bias ? b.data<float>() : nullptr;
  float* db = has_bias ? dw.data<float>() + dw_size : nullptr;
  const double flop = 2.0 * dw_size * g.out_plane() * mb / 1e9;
  auto rate = [&](double seconds) { return static_cast<int>(flop / seconds); };
  OnednnPassTimes t;
  conv.PrepareForwardWeights(w.data<float>());
  conv.PrepareBackwardWeights(w.data<float>());
  const double f = BestSeconds([&] { conv.Forward(x.data<float>(), bias, y.data<float>()); });
  double d = BestSeconds([&] { conv.BackwardData(dy.data<float>(), dx.data<float>()); });
  t.rates = StrCat("forward ", rate(f), ", backward-data ");
  // A pass's primitive against its alternative: the faster by kMargin (a
  // tie keeps the primitive), named in `pick`, its rate beside the other's.
  auto faster = [&](double own, const char* alt, double alt_seconds, std::string& pick) {
    t.rates = StrCat(t.rates, "onednn/", alt, " ", rate(own), "/", rate(alt_seconds));
    if (own <= kMargin * alt_seconds) return own;
    pick = alt;
    return alt_seconds;
  };
  if (conv.HasFlippedData()) {
    conv.PrepareFlippedWeights(w.data<float>());
    d = faster(d, "flipped", BestSeconds([&] {
                 conv.BackwardDataByFlippedForward(dy.data<float>(), dx.data<float>());
               }),
               t.data);
  } else {
    t.rates = StrCat(t.rates, rate(d));
  }
  double wt = BestSeconds(
      [&] { conv.BackwardWeights(x.data<float>(), dy.data<float>(), dw.data<float>(), db); });
  t.rates = StrCat(t.rates, ", backward-weights ");
  if (conv.HasMatmulWeights()) {
    wt = faster(wt, "matmul", BestSeconds([&] {
                  conv.BackwardWeightsByMatmul(x.data<float>(), dy.data<float>(), dw.data<float>(),
                                               db);
                }),
                t.weights);
  } else {
    t.rates = StrCat(t.rates, rate(wt));
  }
  t.seconds = f + d + wt;
  return t;
}

// bf16, and f32 on channels-last tensors: oneDNN's convolution forward;
// for backward-data its convolution or the flipped forward one, for
// backward-weights its convolution or OnednnConv's matmul (bf16 kernels),
// whichever is faster on one chunk: "onednn,onednn|flipped,onednn|matmul".
// bf16 weighs the f32 kernels on the same rounded operands too, and takes
// them where the three passes run kMargin faster (CPUs whose bf16 dot
// products are slower than their f32 FMAs): then a fourth pick, "f32".
// Then the rates of each.
std::string MeasureOnednnPicks(const Conv2dGeometry& g, bool has_bias, int64_t bwd_mb, bool bf16,
                               bool nhwc_in, bool nhwc_out) {
  cpu::OnednnConv conv(g, bwd_mb, has_bias, false, bf16, nhwc_in, nhwc_out);
  const OnednnPassTimes own = TimeOnednnPasses(conv, g, has_bias, bwd_mb);
  std::string picks = StrCat("onednn,", own.data, ",", own.weights);
  std::string rates = StrCat(bf16 ? "bf16" : "f32", " kernels: ", own.rates);
  if (bf16) {
    try {
      cpu::OnednnConv f32(g, bwd_mb, has_bias, false, true, nhwc_in, nhwc_out, true);
      const OnednnPassTimes t = TimeOnednnPasses(f32, g, has_bias, bwd_mb);
      if (own.seconds > kMargin * t.seconds)
        picks = StrCat("onednn,", t.data, ",", t.weights, ",f32");
      rates = StrCat(rates, "; f32 kernels on bf16 operands: ", t.rates);
    } catch (const Error&) {
      // No f32 primitive for the geometry: the bf16 kernels run it.
    }
  }
  return StrCat(picks, " (GFLOP/s of one thread, ", rates, ")");
}

ConvAlgo ParsePick(const std::string& s) {
  if (s == "onednn") return ConvAlgo::kOnednn;
  if (s == "matmul") return ConvAlgo::kMatmul;
  return s == "flipped" ? ConvAlgo::kFlipped : ConvAlgo::kGemm;
}

// The key of a geometry at batch n in the kernel pick cache.
std::string PickKey(const Conv2dGeometry& g, bool has_bias, int64_t n) {
  // The picks hold for one chunk size: the first chunk's stands for all.
  const int64_t fwd_mb = n / BatchChunks(n), bwd_mb = n / BackwardChunks(g, n);
  return StrCat("conv2d in=", g.in_channels, "x", g.in_h, "x", g.in_w, " out=", g.out_channels,
                " kernel=", g.kernel_h, "x", g.kernel_w, " stride=", g.stride_h, "x", g.stride_w,
                " pad=", g.pad_h, "x", g.pad_w, " dilation=", g.dilation_h, "x", g.dilation_w,
                " groups=", g.groups, " bias=", has_bias ? 1 : 0, " mb=", fwd_mb, "/", bwd_mb);
}

// The algorithms of each pass at batch n (measured once per shape under kAuto).
Conv2dPlan PlanConv(const Conv2dGeometry& g, bool has_bias, ConvAlgo algo, Conv2dScratch& scratch,
                    int64_t n, DType dtype) {
  if (dtype != DType::kF32 || (algo == ConvAlgo::kGemm && !scratch.bf16)) return {};
  // f32 on channels-last tensors: oneDNN's primitives (the GEMM path reads
  // NCHW), and where x and y are both NHWC the flipped backward-data if it
  // measures faster.
  const bool f32_nhwc = !scratch.bf16 && scratch.nhwc_in && scratch.nhwc_out;
  if (!scratch.bf16 && !f32_nhwc &&
      (algo == ConvAlgo::kOnednn || scratch.nhwc_in || scratch.nhwc_out)) {
    return {ConvAlgo::kOnednn, ConvAlgo::kOnednn, ConvAlgo::kOnednn};
  }
  std::lock_guard<std::mutex> lock(scratch.mu);
  auto it = scratch.plans.find(n);
  if (it != scratch.plans.end()) return it->second;
  const int64_t fwd_mb = n / BatchChunks(n), bwd_mb = n / BackwardChunks(g, n);
  const std::string key =
      StrCat(PickKey(g, has_bias, n), scratch.bf16 ? " bf16" : "",
             scratch.nhwc_in || scratch.nhwc_out
                 ? StrCat(" nhwc=", scratch.nhwc_in ? "in" : "", scratch.nhwc_out ? "out" : "")
                 : "");
  const std::string picks = cpu::FindOrMeasure(key, [&] {
    return scratch.bf16 || f32_nhwc ? MeasureOnednnPicks(g, has_bias, bwd_mb, scratch.bf16,
                                                         scratch.nhwc_in, scratch.nhwc_out)
                                    : MeasurePicks(g, has_bias, scratch, fwd_mb, bwd_mb);
  });
  // "forward,backward_data,backward_weights[,f32]", then the rates.
  std::vector<std::string> words;
  std::stringstream list(picks.substr(0, picks.find(' ')));
  for (std::string w; std::getline(list, w, ',');) words.push_back(w);
  CNNFLOW_ENFORCE(words.size() == 3 || (words.size() == 4 && words[3] == "f32" && scratch.bf16 &&
                                        words[2] != "matmul"),
                  "conv2d: bad kernel pick '", picks, "' for ", key, " in ", cpu::KernelPickFile());
  Conv2dPlan plan;
  plan.forward = ParsePick(words[0]);
  plan.backward_data = ParsePick(words[1]);
  plan.backward_weights = ParsePick(words[2]);
  plan.f32_kernels = words.size() == 4;
  scratch.plans[n] = plan;
  return plan;
}

// A pair parameter (`kernel: 3` or `kernel: [3, 2]`), checked to be >= lo.
std::pair<int64_t, int64_t> PairArg(const Args& args, const std::string& key, int64_t lo) {
  const std::vector<int64_t> v = args.Ints(key, 2);
  if (v[0] < lo || v[1] < lo) {
    throw ConfigError(
        StrCat("conv2d: '", key, "' must be >= ", lo, ", got [", v[0], ", ", v[1], "]"));
  }
  return {v[0], v[1]};
}

}  // namespace

Conv2d::Conv2d(const std::string& name, const Args& args) : Layer(name) {
  geom_.out_channels = args.Int("out");
  std::tie(geom_.kernel_h, geom_.kernel_w) = PairArg(args, "kernel", 1);
  std::tie(geom_.stride_h, geom_.stride_w) = PairArg(args, "stride", 1);
  std::tie(geom_.pad_h, geom_.pad_w) = PairArg(args, "pad", 0);
  std::tie(geom_.dilation_h, geom_.dilation_w) = PairArg(args, "dilation", 1);
  geom_.groups = args.Int("groups");
  has_bias_ = args.Bool("bias");
  const std::string& algo = args.String("algo");
  algo_ = algo == "gemm" ? ConvAlgo::kGemm : algo == "onednn" ? ConvAlgo::kOnednn : ConvAlgo::kAuto;
  in_arg_ = args.Int("in");
  if (geom_.out_channels < 1) {
    throw ConfigError(StrCat("conv2d: 'out' must be >= 1, got ", geom_.out_channels));
  }
  if (geom_.groups < 1)
    throw ConfigError(StrCat("conv2d: 'groups' must be >= 1, got ", geom_.groups));
  if (in_arg_ < 0) throw ConfigError(StrCat("conv2d: 'in' must be >= 0, got ", in_arg_));
}

Conv2d::~Conv2d() = default;

Shape Conv2d::Build(const std::vector<Shape>& inputs, DType dtype) {
  if (inputs.size() != 1 || inputs[0].rank() != 3) {
    throw ShapeError(StrCat("conv2d expects one [C, H, W] input, got ",
                            inputs.empty() ? std::string("none") : inputs[0].ToString()));
  }
  const Shape& s = inputs[0];
  Conv2dGeometry& g = geom_;
  g.in_channels = s[0];
  g.in_h = s[1];
  g.in_w = s[2];
  if (in_arg_ != 0 && in_arg_ != g.in_channels) {
    throw ShapeError(StrCat("conv2d expects ", in_arg_, " input channels (in: ", in_arg_, "), got ",
                            s, " with ", g.in_channels));
  }
  if (g.in_channels % g.groups != 0) {
    throw ShapeError(StrCat("conv2d: input channels ", g.in_channels,
                            " are not divisible by groups ", g.groups, " (input ", s, ")"));
  }
  if (g.out_channels % g.groups != 0) {
    throw ShapeError(StrCat("conv2d: output channels ", g.out_channels,
                            " (out) are not divisible by groups ", g.groups));
  }
  const int64_t eff_kh = g.dilation_h * (g.kernel_h - 1) + 1;
  const int64_t eff_kw = g.dilation_w * (g.kernel_w - 1) + 1;
  g.out_h = ConvOutputSize(g.in_h, g.kernel_h, g.stride_h, g.pad_h, g.dilation_h);
  g.out_w = ConvOutputSize(g.in_w, g.kernel_w, g.stride_w, g.pad_w, g.dilation_w);
  if (g.out_h <= 0 || g.out_w <= 0) {
    throw ShapeError(StrCat("conv2d: output size ", g.out_h, "x", g.out_w, " <= 0: input ", s,
                            " padded by ", g.pad_h, "x", g.pad_w, " is smaller than the ", eff_kh,
                            "x", eff_kw, " (dilated) kernel"));
  }
  scratch_ = std::make_unique<Conv2dScratch>(g);
  AddParameter("weight", {g.out_channels, g.in_per_group(), g.kernel_h, g.kernel_w}, dtype);
  if (has_bias_) AddParameter("bias", {g.out_channels}, dtype);
  return {g.out_channels, g.out_h, g.out_w};
}

void Conv2d::ResetParameters(Rng& rng) {
  // kaiming_uniform_(a=sqrt(5)) gives bound = 1/sqrt(fan_in); so does the bias.
  const double bound = 1.0 / std::sqrt(static_cast<double>(geom_.col_rows()));
  for (auto& p : parameters()) {
    for (int64_t i = 0; i < p.value.numel(); ++i) p.value.Set(i, rng.Uniform(-bound, bound));
  }
}

const char* ConvAlgoName(ConvAlgo a) {
  switch (a) {
    case ConvAlgo::kAuto:
      return "auto";
    case ConvAlgo::kGemm:
      return "gemm";
    case ConvAlgo::kOnednn:
      return "onednn";
    case ConvAlgo::kMatmul:
      return "matmul";
    case ConvAlgo::kFlipped:
      return "flipped";
  }
  return "?";
}

std::string Conv2d::KernelPickKey(int64_t n) const { return PickKey(geom_, has_bias_, n); }

Conv2dPlan Conv2d::PlanFor(int64_t n, DType dtype) {
  CNNFLOW_ENFORCE(scratch_ != nullptr, "conv2d: PlanFor before Build");
  return PlanConv(geom_, has_bias_, algo_, *scratch_, n, dtype);
}

void Conv2d::Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) {
  const Tensor& in = *x[0];
  CNNFLOW_ENFORCE(scratch_ != nullptr, "conv2d: Forward before Build");
  CNNFLOW_ENFORCE(in.is_contiguous() && y.is_contiguous(), "conv2d needs contiguous tensors");
  const int64_t n = in.dim(0);
  const Tensor& w = parameters()[0].value;
  const bool x16 = in.dtype() == DType::kBF16;  // a bf16 activation (ReadsBf16)
  CNNFLOW_ENFORCE(!x16 || ReadsBf16(0), "conv2d ", name(), ": a bf16 input it cannot read");
  const Conv2dPlan plan = PlanFor(n, w.dtype());
  DispatchFloat(w.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* bias = has_bias_ ? parameters()[1].value.data<T>() : nullptr;
    ConvForward<T>(geom_, plan, x16 ? nullptr : in.data<T>(), w.data<T>(), bias, relu_, y.data<T>(),
                   n, *scratch_, ctx.training,
                   x16 ? static_cast<const uint16_t*>(in.raw_data()) : nullptr);
  });
}

void Conv2d::Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                      const std::vector<Tensor*>& dx) {
  const Tensor& in = *x[0];
  CNNFLOW_ENFORCE(scratch_ != nullptr, "conv2d: Backward before Build");
  CNNFLOW_ENFORCE(in.is_contiguous() && dy.is_contiguous(), "conv2d needs contiguous tensors");
  const int64_t n = in.dim(0);
  const Tensor& w = parameters()[0].value;
  const bool x16 = in.dtype() == DType::kBF16;   // a bf16 activation (ReadsBf16)
  const bool dy16 = dy.dtype() == DType::kBF16;  // a bf16 gradient (ReadsBf16Grad)
  CNNFLOW_ENFORCE(!x16 || ReadsBf16(0), "conv2d ", name(), ": a bf16 input it cannot read");
  CNNFLOW_ENFORCE(!dy16 || ReadsBf16Grad(), "conv2d ", name(), ": a bf16 gradient it cannot read");
  const Conv2dPlan plan = PlanFor(n, w.dtype());
  DispatchFloat(w.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* dxp = dx.empty() || dx[0] == nullptr ? nullptr : dx[0]->data<T>();
    T* db = has_bias_ ? parameters()[1].grad.data<T>() : nullptr;
    ConvBackward<T>(geom_, plan, x16 ? nullptr : in.data<T>(), w.data<T>(),
                    relu_ ? y.data<T>() : nullptr, dy16 ? nullptr : dy.data<T>(), dxp,
                    parameters()[0].grad.data<T>(), db, n, *scratch_,
                    x16 ? static_cast<const uint16_t*>(in.raw_data()) : nullptr,
                    dy16 ? static_cast<const uint16_t*>(dy.raw_data()) : nullptr);
  });
}

Conv2dPasses::Conv2dPasses(const Conv2dGeometry& g, ConvAlgo algo)
    : geom_(g), algo_(algo), scratch_(std::make_unique<Conv2dScratch>(g)) {}

Conv2dPasses::~Conv2dPasses() = default;

void Conv2dPasses::Forward(const Tensor& x, const Tensor& w, Tensor& y) {
  CNNFLOW_ENFORCE(x.is_contiguous() && y.is_contiguous(), "conv2d passes need contiguous tensors");
  const int64_t n = x.dim(0);
  const Conv2dPlan plan = PlanConv(geom_, false, algo_, *scratch_, n, x.dtype());
  DispatchFloat(x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ConvForward<T>(geom_, plan, x.data<T>(), w.data<T>(), nullptr, false, y.data<T>(), n,
                   *scratch_);
  });
}

void Conv2dPasses::BackwardData(const Tensor& w, const Tensor& dy, Tensor& dx) {
  CNNFLOW_ENFORCE(dy.is_contiguous() && dx.is_contiguous(),
                  "conv2d passes need contiguous tensors");
  const int64_t n = dy.dim(0);
  const Conv2dPlan plan = PlanConv(geom_, false, algo_, *scratch_, n, dy.dtype());
  DispatchFloat(dy.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ConvBackward<T>(geom_, plan, nullptr, w.data<T>(), nullptr, dy.data<T>(), dx.data<T>(), nullptr,
                    nullptr, n, *scratch_);
  });
}

void Conv2dPasses::BackwardWeights(const Tensor& x, const Tensor& dy, Tensor& dw) {
  CNNFLOW_ENFORCE(x.is_contiguous() && dy.is_contiguous(), "conv2d passes need contiguous tensors");
  const int64_t n = x.dim(0);
  const Conv2dPlan plan = PlanConv(geom_, false, algo_, *scratch_, n, x.dtype());
  DispatchFloat(x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    // w is read only by the backward-data half, which is skipped (dx null).
    ConvBackward<T>(geom_, plan, x.data<T>(), nullptr, nullptr, dy.data<T>(), nullptr, dw.data<T>(),
                    nullptr, n, *scratch_);
  });
}

bool Conv2d::ComputeInBf16() {
  CNNFLOW_ENFORCE(scratch_ != nullptr, "conv2d: ComputeInBf16 before Build");
  std::lock_guard<std::mutex> lock(scratch_->mu);
  scratch_->bf16 = true;
  scratch_->plans.clear();
  scratch_->onednn.clear();
  return true;
}

Layer::ChannelsLast Conv2d::ChannelsLastSupport() const {
  if (scratch_ == nullptr) return ChannelsLast::kNo;
  // f32: oneDNN's primitives only (our GEMM lowering reads NCHW), where
  // they take channels-last tensors as they are.
  return scratch_->bf16 || (algo_ != ConvAlgo::kGemm && cpu::OnednnHasAvx512Core())
             ? ChannelsLast::kConverts
             : ChannelsLast::kNo;
}

bool Conv2d::ReadsBf16(size_t input) const {
  return input == 0 && scratch_ != nullptr && scratch_->bf16 && nhwc_input(0);
}

bool Conv2d::ReadsBf16Grad() const {
  return scratch_ != nullptr && scratch_->bf16 && nhwc_output() && !relu_;
}

void Conv2d::SetChannelsLast(const std::vector<bool>& inputs, bool output) {
  CNNFLOW_ENFORCE(ChannelsLastSupport() == ChannelsLast::kConverts,
                  "conv2d: channels-last tensors where its kernels read NCHW only");
  Layer::SetChannelsLast(inputs, output);
  std::lock_guard<std::mutex> lock(scratch_->mu);
  scratch_->nhwc_in = nhwc_input();
  scratch_->nhwc_out = output;
  scratch_->plans.clear();
  scratch_->onednn.clear();
}

int64_t Conv2d::ForwardFlops(int64_t n) const {
  return 2 * n * geom_.out_channels * geom_.col_rows() * geom_.out_plane();
}

CNNFLOW_REGISTER_LAYER(
    conv2d, Conv2d,
    Schema("2D convolution [C, H, W] -> [K, H', W'] (PyTorch's Conv2d: weight [K, C/groups, "
           "kh, kw], bias [K]); H' = (H + 2*pad - dilation*(kernel-1) - 1) / stride + 1")
        .Required("out", ParamType::kInt, "output channels K")
        .Required("kernel", ParamType::kIntList, "kernel size: k or [kh, kw]")
        .Optional("stride", ParamType::kIntList, int64_t{1}, "stride: s or [sh, sw]")
        .Optional("pad", ParamType::kIntList, int64_t{0},
                  "zero padding on each side: p or [ph, pw]")
        .Optional("dilation", ParamType::kIntList, int64_t{1}, "kernel dilation: d or [dh, dw]")
        .Optional("groups", ParamType::kInt, int64_t{1},
                  "channel groups; C and K must be divisible by it")
        .Optional("bias", ParamType::kBool, true, "learn an additive bias per output channel")
        .Optional("in", ParamType::kInt, int64_t{0},
                  "input channels C, checked against the input (0: inferred)")
        .Choice("algo", {"auto", "gemm", "onednn"}, "auto",
                "CPU kernels: im2col + GEMM, oneDNN's primitives (f32), or auto: the faster "
                "of the two per pass, measured once per shape on this machine"));

}  // namespace cnnflow
