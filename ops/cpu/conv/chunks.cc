// conv2d's passes over a batch, chunk by chunk (chunks.h).
#include "ops/cpu/conv/chunks.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <type_traits>

#include "ops/cpu/conv/lowering.h"
#include "ops/cpu/conv/onednn_conv.h"
#include "ops/cpu/conv/scratch.h"
#include "ops/cpu/elementwise.h"
#include "ops/cpu/parallel.h"

namespace cnnflow::cpu {
namespace {

constexpr int64_t kMinChunkPositions = 400;  // BackwardChunks

// The oneDNN convolution for chunks of mb samples (made on first use).
OnednnConv& OnednnFor(const Conv2dGeometry& g, bool bias, bool relu, bool f32_kernels,
                      Conv2dScratch& scratch, int64_t mb) {
  std::lock_guard<std::mutex> lock(scratch.mu);
  auto& conv = scratch.onednn[{mb, f32_kernels}];
  if (conv == nullptr) {
    const OnednnConv::Options options{.bias = bias,
                                      .relu = relu,
                                      .bf16 = scratch.bf16,
                                      .nhwc_in = scratch.nhwc_in,
                                      .nhwc_out = scratch.nhwc_out,
                                      .f32_kernels = f32_kernels};
    conv = std::make_unique<OnednnConv>(g, mb, options);
  }
  return *conv;
}

// The oneDNN convolutions of the chunks of n samples cut in `chunks`:
// ForChunks' chunks hold n / chunks samples, or one more.
struct ChunkConvs {
  int64_t small = 0;
  OnednnConv* conv[2] = {nullptr, nullptr};  // small, small + 1 samples

  OnednnConv& For(int64_t mb) const { return *conv[mb - small]; }
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (OnednnConv* c : conv)
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

// Which algorithm runs each backward pass of one ConvBackward call, and the
// layout of the chunks' partial sums of dW and dbias.
struct BackwardRoute {
  int64_t chunks = 0;
  int64_t dw_size = 0;                                  // |dW|
  int64_t part_size = 0;                                // dW then dbias, per chunk
  bool onednn_data = false, flipped_data = false;       // dx by oneDNN: flipped, or its primitive
  bool onednn_weights = false, matmul_weights = false;  // dW by oneDNN: matmul, or its primitive
  bool dw_transposed = false;  // the GEMMs' partial dW is transposed (GemmDwTransposed)
};

template <typename T>
BackwardRoute RouteBackward(const Conv2dGeometry& g, const Conv2dPlan& plan, int64_t n,
                            bool want_dw) {
  constexpr bool f32 = std::is_same_v<T, float>;
  BackwardRoute r;
  r.chunks = BackwardChunks(g, n);
  r.dw_size = g.out_channels * g.col_rows();
  r.part_size = r.dw_size + g.out_channels;
  r.flipped_data = f32 && plan.backward_data == ConvAlgo::kFlipped;
  r.onednn_data = r.flipped_data || (f32 && plan.backward_data == ConvAlgo::kOnednn);
  r.matmul_weights = want_dw && f32 && plan.backward_weights == ConvAlgo::kMatmul;
  r.onednn_weights =
      r.matmul_weights || (want_dw && f32 && plan.backward_weights == ConvAlgo::kOnednn);
  r.dw_transposed = !r.onednn_weights && GemmDwTransposed(g);
  return r;
}

// The oneDNN convolutions of a backward's chunks, where a pass runs on
// them, their backward-data weights prepared from w where dx is wanted.
template <typename T>
ChunkConvs PrepareOnednnBackward(const Conv2dGeometry& g, const Conv2dPlan& plan,
                                 const BackwardRoute& r, const T* w, bool bias, bool relu,
                                 bool want_dx, Conv2dScratch& scratch, int64_t n) {
  ChunkConvs convs;
  if constexpr (std::is_same_v<T, float>) {
    if (r.onednn_data || r.onednn_weights) {
      convs = OnednnChunks(g, plan, bias, relu, scratch, n, r.chunks);
      if (r.onednn_data && want_dx) {
        convs.ForEach([&](OnednnConv& c) {
          if (r.flipped_data) {
            c.PrepareFlippedWeights(w);
          } else {
            c.PrepareBackwardWeights(w);
          }
        });
      }
    }
  }
  return convs;
}

// The backward-weights' last step: the chunks' partial sums (dW then
// dbias, part_size apart; db null: dW only) added in chunk order, then
// added into dw and db.
template <typename T>
void AddChunkSums(const Conv2dGeometry& g, const BackwardRoute& route, const T* partial, T* dw,
                  T* db) {
  const int64_t chunks = route.chunks, dw_size = route.dw_size, part_size = route.part_size;
  const int64_t total = db != nullptr ? part_size : dw_size;
  const int64_t rows = g.col_rows(), kg = g.out_per_group();
  if (route.dw_transposed) {
    ParallelFor(total, 4096, [&](int64_t b, int64_t e) {
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
  // vectorise and stream each partial buffer, which the per-element loop
  // above does not (bench/results/2026-12-07-conv-notes.md).
  ParallelFor(total, 4096, [&](int64_t b, int64_t e) {
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

}  // namespace

int64_t BatchChunks(int64_t n) { return NumChunks(n, 1); }

int64_t BackwardChunks(const Conv2dGeometry& g, int64_t n) {
  return NumChunks(n, CeilDiv(kMinChunkPositions, g.out_plane()));
}

template <typename T>
void ConvForward(const Conv2dGeometry& g, const Conv2dPlan& plan, const T* x, const T* w,
                 const T* bias, bool relu, T* y, int64_t n, Conv2dScratch& scratch, bool keep,
                 const uint16_t* x_bf16) {
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
      convs.ForEach([&](OnednnConv& c) {
        c.PrepareForwardWeights(w);
        keeps = keeps && c.KeepsInput(plan.backward_weights);
      });
      const int64_t in_sample = g.in_channels * g.in_plane();
      const int64_t out_sample = g.out_channels * g.out_plane();
      uint16_t* kept = keeps ? scratch.Keep(x, n * in_sample) : nullptr;
      ForChunks(n, chunks, [&](int64_t, int64_t begin, int64_t end) {
        convs.For(end - begin)
            .Forward(x_bf16 != nullptr ? nullptr : x + begin * in_sample, bias,
                     y + begin * out_sample, kept != nullptr ? kept + begin * in_sample : nullptr,
                     x_bf16 != nullptr ? x_bf16 + begin * in_sample : nullptr);
      });
      return;
    }
  }
  ForChunks(n, chunks, [&](int64_t, int64_t begin, int64_t end) {
    GemmForwardChunk(g, scratch, x, w, bias, relu, y, begin, end);
  });
}

template <typename T>
void ConvBackward(const Conv2dGeometry& g, const Conv2dPlan& plan, const T* x, const T* w,
                  const T* relu_y, const T* dy, T* dx, T* dw, T* db, int64_t n,
                  Conv2dScratch& scratch, const uint16_t* x_bf16, const uint16_t* dy_bf16) {
  if (n == 0) return;
  const bool want_dw = dw != nullptr;
  if (!want_dw) db = nullptr;
  const BackwardRoute r = RouteBackward<T>(g, plan, n, want_dw);
  const int64_t dw_size = r.dw_size, part_size = r.part_size;
  const bool onednn_data = r.onednn_data, onednn_weights = r.onednn_weights;
  if (want_dw && (!scratch.partial.defined() || scratch.partial.dtype() != DTypeOf<T>() ||
                  scratch.partial.numel() < r.chunks * part_size)) {
    scratch.partial = Tensor::Empty({r.chunks * part_size}, DTypeOf<T>());
  }
  T* partial = want_dw ? scratch.partial.data<T>() : nullptr;
  CNNFLOW_ENFORCE(x_bf16 == nullptr || !want_dw || onednn_weights,
                  "conv2d: a bf16 input outside the bf16 kernels");
  CNNFLOW_ENFORCE(dy_bf16 == nullptr || ((!want_dw || onednn_weights) &&
                                         (dx == nullptr || onednn_data) && relu_y == nullptr),
                  "conv2d: a bf16 gradient outside the bf16 kernels");
  // x as the forward kept it in bf16 (Conv2dScratch::Keep), if it did.
  const Tensor kept =
      want_dw && x_bf16 == nullptr && onednn_weights && (!r.matmul_weights || scratch.nhwc_in)
          ? scratch.Take(x)
          : Tensor();
  const auto* x16 = x_bf16 != nullptr ? x_bf16 : static_cast<const uint16_t*>(kept.raw_data());
  const ChunkConvs convs = PrepareOnednnBackward(g, plan, r, w, db != nullptr, relu_y != nullptr,
                                                 dx != nullptr, scratch, n);
  const int64_t in_sample = g.in_channels * g.in_plane();
  const int64_t out_sample = g.out_channels * g.out_plane();
  const int64_t max_chunk = CeilDiv(n, r.chunks);

  // Each chunk runs both passes: oneDNN's, converting dy once for the two,
  // then the GEMMs' (a lowered chunk gathers dy once for the two).
  ForChunks(n, r.chunks, [&](int64_t chunk, int64_t begin, int64_t end) {
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
  AddChunkSums(g, r, partial, dw, db);
}

template void ConvForward<float>(const Conv2dGeometry&, const Conv2dPlan&, const float*,
                                 const float*, const float*, bool, float*, int64_t, Conv2dScratch&,
                                 bool, const uint16_t*);
template void ConvForward<double>(const Conv2dGeometry&, const Conv2dPlan&, const double*,
                                  const double*, const double*, bool, double*, int64_t,
                                  Conv2dScratch&, bool, const uint16_t*);
template void ConvBackward<float>(const Conv2dGeometry&, const Conv2dPlan&, const float*,
                                  const float*, const float*, const float*, float*, float*, float*,
                                  int64_t, Conv2dScratch&, const uint16_t*, const uint16_t*);
template void ConvBackward<double>(const Conv2dGeometry&, const Conv2dPlan&, const double*,
                                   const double*, const double*, const double*, double*, double*,
                                   double*, int64_t, Conv2dScratch&, const uint16_t*,
                                   const uint16_t*);

}  // namespace cnnflow::cpu
