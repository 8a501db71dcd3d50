// The CPU convolution's state of one conv2d layer (Conv2dScratch): what
// Build precomputes from the geometry for the GEMM lowering, the per-thread
// scratch buffers kept for the layer's life, the algorithm picks and
// oneDNN convolutions it has made, and the bf16 x that a forward keeps for
// its backward. Internal to ops/cpu/conv/.
#pragma once

#include <tbb/enumerable_thread_specific.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "ops/cpu/conv/onednn_conv.h"
#include "ops/layers/conv2d.h"
#include "ops/tensor.h"

namespace cnnflow {

// One tap's valid span [p0, p1) of a shiftable geometry (cpu::IsShiftable;
// outside it the col row is always zero), and its offset into the input
// plane.
struct TapSpan {
  int64_t p0, p1, shift;
};

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

namespace cpu {

// This thread's buffer of exactly `size` elements, made anew (zeroed if
// asked) when its size or type changes, else kept as it was.
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

}  // namespace cpu
}  // namespace cnnflow
