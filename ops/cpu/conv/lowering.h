// The GEMM lowering of conv2d (im2col + GEMM, col2im): one chunk of the
// batch per call, on the calling thread. Per sample and group g (Kg =
// K/groups output channels, R = C/groups*kh*kw rows of the im2col matrix,
// P = H'*W' columns):
//   forward   Y_g[Kg, P]   = W_g[Kg, R] * col(X_g)[R, P]  (+ bias: Y starts as it)
//   backward  dW_g[Kg, R] += dY_g[Kg, P] * col(X_g)^T[P, R]
//             dX_g          = col2im(W_g^T[R, Kg] * dY_g[Kg, P])
// Pointwise convs (1x1, stride 1, no padding) skip im2col: the input is the
// col matrix. Each GEMM is per sample: lowering several samples into one
// wider GEMM costs a scatter of Y and a gather of dY, and pays only where a
// sample has few output positions (LowersChunk: the whole chunk is one GEMM
// over mb * P columns). For stride 1 with W' == W (every "same" conv) a col
// row is one contiguous span of the input (one copy instead of a copy per
// output row); col buffers stay zeroed where the padding is; col2im starts
// from the centre tap instead of a zeroed dx. The measurements behind these
// choices: bench/results/2026-12-07-conv-notes.md. Also here: the bf16
// im2col of oneDNN's matmul backward-weights. Internal to ops/cpu/conv/.
#pragma once

#include <cstdint>

#include "ops/layers/conv2d.h"

namespace cnnflow::cpu {

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// For stride 1 with W' == W ("same" width), output position p = oh * W + ow
// of tap (i, j) reads input p + shift, shift = ih0 * W + iw0: a col row is
// one contiguous span of the input plane, except for the border columns
// (ow + iw0 outside [0, W)), where the span holds wrapped values of the
// neighbouring input row that must be zeroed (Conv2dScratch's taps).
bool IsShiftable(const Conv2dGeometry& g);

// Whether the GEMM path's partial dW is transposed, dW^T[R, Kg] per group
// (few col rows), which the chunk sum transposes back.
bool GemmDwTransposed(const Conv2dGeometry& g);

// GEMM path, samples [begin, end): x [n, C, H, W], w [K, C/groups, kh, kw],
// bias [K] or null -> y [n, K, H', W'] (relu: max(y, 0)).
template <typename T>
void GemmForwardChunk(const Conv2dGeometry& g, Conv2dScratch& scratch, const T* x, const T* w,
                      const T* bias, bool relu, T* y, int64_t begin, int64_t end);

// GEMM path, samples [begin, end) of x, w, dy: adds into pdw (dW of the
// chunk, transposed per group when GemmDwTransposed; null: skipped) and pdb
// (null: skipped); writes dx [n, C, H, W] (null: skipped).
template <typename T>
void GemmBackwardChunk(const Conv2dGeometry& g, Conv2dScratch& scratch, const T* x, const T* w,
                       const T* dy, T* dx, T* pdw, T* pdb, int64_t begin, int64_t end);

// The bf16 im2col of oneDNN's matmul backward-weights (MatmulWeightsPass,
// onednn_passes.h), on a whole chunk of mb samples:
// xb [mb, C, H, W] bf16 -> col^T [C * kh * kw, mb * H' * W'] (row r =
// (c, i, j), column q = (s, oh, ow)): bf16 words copied, zero outside x.
void Im2ColTransposed(const Conv2dGeometry& g, int64_t mb, const uint16_t* xb, uint16_t* col);

// xb [mb, H, W, C] bf16 -> col [mb * H' * W', kh * kw * C] (row q = (s, oh,
// ow), column (i, j, c)): each tap a copy of C contiguous words, zero
// outside x.
void Im2ColNhwc(const Conv2dGeometry& g, int64_t mb, const uint16_t* xb, uint16_t* col);

}  // namespace cnnflow::cpu
