// oneDNN's convolution primitives for one conv2d geometry and one
// mini-batch size: forward, backward-data and backward-weights, f32, or
// bf16 products over f32 tensors (graph.precision: bf16 on the CPU).
//
// TBB owns the threads (ops/cpu/parallel.h): each call runs the primitive on
// the calling thread alone (one OpenMP thread, TOOLCHAIN.md) over one chunk
// of the batch, and the layer runs its chunks in parallel. So the result of
// a chunk depends only on its size, and a layer's output is bitwise the same
// for any thread count.
//
// The layer's tensors stay in PyTorch's layouts (x, y [mb, C, H, W] plain,
// or [mb, H, W, C] where the model keeps them channels-last; weight
// [K, C/groups, kh, kw]); the primitives are created with
// format_tag::any, so oneDNN picks its blocked layouts (nChw8c on AVX2,
// nChw16c on AVX-512) and each call reorders its chunk in and out through
// per-thread scratch. Weights are reordered once per pass (Prepare*).
// Each pass has a builder of its own (onednn_passes.h), fed by one Options.
//
// bf16 (as PyTorch's CPU autocast, but with f32 between layers): x, w and dy
// are rounded to bf16 in those same reorders, the primitives multiply in
// bf16 and accumulate in f32, and y, dx and dw come out in f32. Only where
// the CPU has native bf16 (cpu::NoNativeBf16Reason). Or the same rounded
// operands on oneDNN's f32 kernels (f32_kernels), for CPUs whose bf16 dot
// products run at half their f32 FMAs' rate (avx512_bf16 without AMX): a
// product of two bf16 values is exact in f32, so the results differ from
// the bf16 kernels' only in the order of the f32 sums.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ops/layers/conv2d.h"

namespace cnnflow::cpu {

class OnednnConv {
 public:
  // What the convolution computes and on which layouts (all false: f32,
  // NCHW, no bias, no ReLU).
  struct Options {
    bool bias = false;  // Forward adds a bias [K]; BackwardWeights* write db
    bool relu = false;  // Forward writes max(y, 0) (a post-op inside the kernel)
    bool bf16 = false;  // the products in bf16 (x, w, dy rounded to it), summed in f32
    // x and dx are [mb, H, W, C]; y and dy [mb, H', W', K] (channels-last
    // activations, Layer::ChannelsLast), which bf16's kernels read and
    // write without a transpose.
    bool nhwc_in = false, nhwc_out = false;
    bool f32_kernels = false;  // bf16 only: the bf16-rounded operands on the f32 kernels
  };
  // mb: the samples of every call. Throws Error when oneDNN has no
  // primitive for the geometry.
  OnednnConv(const Conv2dGeometry& g, int64_t mb, const Options& options);
  ~OnednnConv();
  OnednnConv(const OnednnConv&) = delete;
  OnednnConv& operator=(const OnednnConv&) = delete;

  int64_t mb() const { return mb_; }
  // The implementations oneDNN chose ("jit:avx2", "gemm:jit", ...), for logs.
  std::string ImplInfo() const;

  // w [K, C/groups, kh, kw] into the forward (resp. backward-data)
  // primitive's layout. Once per pass, before the chunks; not concurrent
  // with the calls that read it.
  void PrepareForwardWeights(const float* w);
  void PrepareBackwardWeights(const float* w);

  // The per-chunk calls; any number may run at once on different threads.
  // x [mb, C, H, W], bias [K] or null -> y [mb, K, H', W']. keep_x (where
  // KeepsInput): x in bf16 NHWC is written there, for Backward to read
  // instead of converting x again. x_bf16 (bf16 only): x given in bf16
  // NHWC instead (x unused), as a bf16 activation (Layer::ReadsBf16).
  void Forward(const float* x, const float* bias, float* y, uint16_t* keep_x = nullptr,
               const uint16_t* x_bf16 = nullptr) const;
  // Whether the forward reads x as bf16 NHWC (our own conversion) and the
  // backward-weights by `weights` (kOnednn or kMatmul) reads the same, so
  // Forward can keep it for Backward.
  bool KeepsInput(ConvAlgo weights) const;
  // The backward of one chunk, converting each operand once for both
  // passes: dx (null: skipped) by `data` (kOnednn or kFlipped), dw and db
  // (dw null: skipped) by `weights` (kOnednn or kMatmul, as the calls
  // below). kept_x: x in bf16 NHWC (as Forward kept it, or a bf16
  // activation), or null. dy_bf16 (bf16 only): dy given in bf16 NHWC
  // instead (dy unused), as a bf16 gradient (Layer::ReadsBf16Grad).
  void Backward(const float* x, const uint16_t* kept_x, const float* dy, float* dx, ConvAlgo data,
                float* dw, float* db, ConvAlgo weights, const uint16_t* dy_bf16 = nullptr) const;
  // dy [mb, K, H', W'] -> dx [mb, C, H, W] (overwritten). dy_bf16: dy in
  // bf16 NHWC instead, or null.
  void BackwardData(const float* dy, float* dx, const uint16_t* dy_bf16 = nullptr) const;
  // x, dy -> dw [K, C/groups, kh, kw] and db [K] (db null: no bias),
  // overwritten with this chunk's sums.
  // x_bf16, dy_bf16: x, dy in bf16 NHWC instead, or null.
  void BackwardWeights(const float* x, const float* dy, float* dw, float* db,
                       const uint16_t* x_bf16 = nullptr, const uint16_t* dy_bf16 = nullptr) const;
  // dy -> dx as the forward convolution of dy with w flipped in space and
  // its channel axes swapped, on oneDNN's brgemm forward kernels (its 2.6
  // backward-data ones are plain jit). Where HasFlippedData: bf16 kernels,
  // or f32 ones with x and y both channels-last (read and written as they are);
  // ungrouped, stride 1, and not on a reference kernel.
  // PrepareFlippedWeights(w) once per pass first. dy_bf16: dy in bf16 NHWC
  // instead, or null.
  bool HasFlippedData() const;
  void PrepareFlippedWeights(const float* w);
  void BackwardDataByFlippedForward(const float* dy, float* dx,
                                    const uint16_t* dy_bf16 = nullptr) const;
  // The backward-weights in bf16 as one matmul, dW = dY^T col (oneDNN's
  // brgemm, which oneDNN 2.6 has for matmul but not for this pass of a
  // convolution: faster for small planes of many channels), db summed from
  // the rounded dy. Where HasMatmulWeights: bf16 kernels, ungrouped, and the CPU has avx512_bf16.
  // From NHWC tensors only: kept_x, x as Forward kept it (bf16 NHWC), and
  // dy_bf16, dy already in bf16 (or null: converted here).
  bool HasMatmulWeights() const;
  void BackwardWeightsByMatmul(const float* x, const float* dy, float* dw, float* db,
                               const uint16_t* kept_x = nullptr,
                               const uint16_t* dy_bf16 = nullptr) const;

 private:
  struct Impl;
  int64_t mb_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cnnflow::cpu
