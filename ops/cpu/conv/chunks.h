// conv2d's passes over a batch, chunk by chunk: how a batch is cut
// (BatchChunks, BackwardChunks: counts that depend on the shape only), and
// ConvForward and ConvBackward, which run each chunk on one thread by the
// algorithms of the layer's plan (the GEMM lowering, lowering.h, or
// oneDNN's, onednn_conv.h) and add the chunks' weight gradients in chunk
// order: bitwise the same results for any thread count. Internal to
// ops/cpu/conv/.
#pragma once

#include <cstdint>

#include "ops/layers/conv2d.h"

namespace cnnflow::cpu {

// Forward chunks: a function of the batch size only (determinism).
int64_t BatchChunks(int64_t n);

// Backward chunks: each sums its own dW, and the partial sums are added
// after (chunks x |dW| of memory traffic). A chunk gets at least
// kMinChunkPositions output positions, so that traffic stays under ~1% of
// the FLOPs' time: ResNet-18's 4x4 stage gets 2 chunks at batch 64, the
// 32x32 stage 16. Still a function of the shape only.
int64_t BackwardChunks(const Conv2dGeometry& g, int64_t n);

// x [n, C, H, W], w [K, C/groups, kh, kw], bias [K] or null -> y [n, K, H', W'].
// relu: y = max(conv, 0) (a fused ReLU). keep: a backward of this x follows
// (scratch.Keep it where its backward-weights can read it). x_bf16: x given
// in bf16 NHWC instead (Conv2d::ReadsBf16; x null).
template <typename T>
void ConvForward(const Conv2dGeometry& g, const Conv2dPlan& plan, const T* x, const T* w,
                 const T* bias, bool relu, T* y, int64_t n, Conv2dScratch& scratch,
                 bool keep = false, const uint16_t* x_bf16 = nullptr);

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
                  const uint16_t* dy_bf16 = nullptr);

}  // namespace cnnflow::cpu
