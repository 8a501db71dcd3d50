// OnednnConv's passes, one builder each, as oneDNN's
// examples/primitives/convolution.cpp builds a primitive: (1) memory
// descriptors, format_tag::any where oneDNN may pick the layout; (2)
// attributes and post-ops; (3) the primitive descriptor; (4) the primitive;
// (5) reorders where the user's layout and the primitive's differ; (6)
// execute (Run). Each pass owns its descriptor, primitive, reorders and
// prepared weights:
//   ForwardPass           the convolution forward (+ ReLU post-op)
//   BackwardDataPass      its backward-data primitive
//   FlippedDataPass       backward-data as a forward convolution of dy with
//                         the flipped kernel (stride 1)
//   BackwardWeightsPass   its backward-weights primitive
//   MatmulWeightsPass     backward-weights as im2col + one bf16 matmul
// The convolution's own three (forward, backward-data, backward-weights)
// are described together (BuildConvolutionPasses): the backward ones take
// the forward's as their hint, and all three the activations' layout that
// none of them runs a reference kernel on. Internal to ops/cpu/conv/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <dnnl.hpp>

#include "ops/cpu/conv/onednn_conv.h"
#include "ops/cpu/conv/onednn_reorder.h"
#include "ops/layers/conv2d.h"
#include "ops/tensor.h"

namespace cnnflow::cpu {

// The convolution's shapes as oneDNN takes them, for chunks of mb samples.
struct ConvDims {
  ConvDims(const Conv2dGeometry& g, int64_t mb);
  bool grouped;
  dnnl::memory::dims src, dst, weights;  // x [mb, C, H, W], y, w (goihw where grouped)
  dnnl::memory::dims strides, dilates;   // dilates: oneDNN's, dilation - 1
  dnnl::memory::dims pad_l, pad_r;       // padding; pad_r gives the floor output size
};

// The user's tensors as OnednnConv's callers lay them out: f32 x, dx (NCHW
// or NHWC), y, dy (NCHW or NHWC), w [K, C/groups, kh, kw], bias [K]; and
// x and dy in bf16 NHWC (bf16 kernels: as a forward kept x, or a bf16
// activation or gradient gives them).
struct UserLayouts {
  UserLayouts() = default;
  UserLayouts(const ConvDims& d, bool nhwc_in, bool nhwc_out);
  dnnl::memory::desc x, y, weights, bias;
  dnnl::memory::desc x_bf16, dy_bf16;
};

// Step 1 of the convolution's own passes: the memory descriptors, the
// activations in layout `act` (format_tag::any: oneDNN picks; nhwc: the
// user's), the weights in format_tag::any; the products' operands (x, w,
// dy) in `op`, the results (y, dx, dw) in f32.
struct ConvDescs {
  ConvDescs(const ConvDims& d, dnnl::memory::data_type op, dnnl::memory::format_tag act);
  dnnl::memory::desc src, dst, weights, diff_dst, diff_src, diff_weights;
};

// One thread's buffers for OnednnConv's calls. The first three hold a
// pass's operands and results in its primitive's layout where that is not
// the user's (ThreadBufferBytes gives their sizes: the most any pass needs).
struct ThreadBuffers {
  Tensor reordered_in;     // x (forward, backward-weights) or dy (backward-data, flipped)
  Tensor reordered_out;    // y or dx before their reorder out; the backward-weights' dy
  Tensor reordered_dw;     // the backward-weights' dW before its reorder out
  Tensor scratchpad;       // the scratchpad of the primitives and reorders
  Tensor col, dy_t;        // matmul: col (transposed for NCHW) and dY in bf16
  Tensor x16;              // x in bf16: the matmul's, or rounded for the f32 kernels
  Tensor dw_t;             // matmul from NHWC: dW [K, kh, kw, C]
  Tensor dy16;             // Backward: dy in bf16 NHWC, for both passes
  Tensor dy_rounded;       // dy rounded to bf16 values, in f32, for both passes
  Tensor weights_rounded;  // f32 kernels: the rounded weights on their way to a reorder
};
struct ThreadBufferBytes {
  size_t reordered_in = 0, reordered_out = 0, reordered_dw = 0, scratchpad = 0;
};

// t, grown to hold at least `bytes`; its data.
void* Fit(Tensor& t, size_t bytes);

// Where r writes (or reads) a buffer laid out as md: md's size, or 0 where
// r is not needed.
size_t BufferBytes(const Reorder& r, const dnnl::memory::desc& md);

// A pass's weights in its primitive's layout, reordered once per pass
// (OnednnConv::Prepare*): what the primitive reads, `ptr`.
struct PreparedWeights {
  Reorder reorder;            // the user's w -> the primitive's layout
  Tensor buf;                 // where the reorder writes it (where needed)
  Tensor rounded;             // f32 kernels: w rounded to bf16 values, where no reorder copies it
  const void* ptr = nullptr;  // null until prepared
};

// The forward convolution, with the ReLU as a post-op where asked.
struct ForwardPass {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward primitive;
  Reorder x_in, y_out;  // the user's x -> the primitive's; the primitive's y -> the user's
  Reorder x16_in;       // bf16: x in bf16 NHWC -> the primitive's
  PreparedWeights weights;

  // Steps 2 and 3: with relu, an inference primitive with the ReLU
  // post-op; otherwise the hint itself.
  void Describe(const ConvDescs& md, const ConvDims& d, const dnnl::memory::desc& bias, bool relu,
                const dnnl::convolution_forward::primitive_desc& hint);
  // Steps 4 and 5.
  void Build(const UserLayouts& user, bool bf16, const dnnl::primitive_attr& attr);
  // Step 6: src (in the primitive's layout), bias -> y (the user's).
  void Run(const void* src, const float* bias, float* y, const UserLayouts& user, bool has_bias,
           ThreadBuffers& s) const;
};

// The convolution's backward-data primitive.
struct BackwardDataPass {
  dnnl::convolution_backward_data::primitive_desc pd;
  dnnl::convolution_backward_data primitive;
  Reorder dy_in, dx_out;
  Reorder dy16_in;  // bf16: dy in bf16 NHWC -> the primitive's
  PreparedWeights weights;

  void Describe(const ConvDescs& md, const ConvDims& d, const dnnl::primitive_attr& attr,
                const dnnl::convolution_forward::primitive_desc& hint);
  void Build(const UserLayouts& user, bool bf16, const dnnl::primitive_attr& attr);
  // diff_dst (dy in the primitive's layout) -> dx (the user's).
  void Run(const void* diff_dst, float* dx, ThreadBuffers& s) const;
};

// The convolution's backward-weights primitive (db too, where it has a bias).
struct BackwardWeightsPass {
  dnnl::convolution_backward_weights::primitive_desc pd;
  dnnl::convolution_backward_weights primitive;
  Reorder x_in, dy_in, dw_out;
  Reorder x16_in, dy16_in;  // bf16: x, dy in bf16 NHWC -> the primitive's

  void Describe(const ConvDescs& md, const ConvDims& d, const dnnl::memory::desc& bias,
                const dnnl::primitive_attr& attr,
                const dnnl::convolution_forward::primitive_desc& hint);
  void Build(const UserLayouts& user, bool bf16, const dnnl::primitive_attr& attr);
  // src (x), diff_dst (dy), both in the primitive's layouts -> dw (the
  // user's), db (null: no bias).
  void Run(const void* src, const void* diff_dst, float* dw, float* db, const UserLayouts& user,
           bool has_bias, ThreadBuffers& s) const;
};

// Steps 1-5 of the three passes above: for each layout of the activations
// to try (direct: NHWC as the user's, then format_tag::any; otherwise any),
// the memory descriptors (the products' operands x, w, dy in `op`, the
// results in f32), the forward training primitive as the hint, and each
// pass's primitive descriptor, until none is a reference kernel; then the
// primitives and their reorders. Throws dnnl::error where oneDNN has none.
void BuildConvolutionPasses(const ConvDims& d, const UserLayouts& user,
                            const OnednnConv::Options& o, dnnl::memory::data_type op, bool direct,
                            const dnnl::primitive_attr& attr, ForwardPass& forward,
                            BackwardDataPass& backward_data, BackwardWeightsPass& backward_weights);

// The backward-data of a stride-1 convolution as a forward one: dx =
// conv(dy, w flipped in space with its channel axes swapped), padded by
// dilation * (k - 1) - pad, which runs on oneDNN's brgemm forward kernels.
struct FlippedDataPass {
  bool available = false;  // built, and not on a reference kernel
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward primitive;
  Reorder dy_in, dx_out;
  Reorder dy16_in;          // bf16: dy in bf16 NHWC -> the primitive's
  Tensor flipped_f32;       // w flipped in space, [K, C, kh, kw]
  PreparedWeights weights;  // flipped_f32 (iohw of [C, K, kh, kw]) in pd's layout

  // Steps 1-5, where the geometry allows it: bf16 kernels, or f32 ones
  // with both activations channels-last (direct); ungrouped, stride 1, and
  // no padding beyond the kernel's span. Throws dnnl::error.
  void Build(const Conv2dGeometry& g, const ConvDims& d, const UserLayouts& user,
             dnnl::memory::data_type op, bool bf16_kernels, bool direct, bool bf16,
             const dnnl::primitive_attr& attr);
  // w -> weights (f32 kernels: rounded to bf16 values); `scratchpad`: the
  // reorder's.
  void Prepare(const Conv2dGeometry& g, const float* w, bool f32_kernels, void* scratchpad);
  void Run(const void* diff_dst, float* dx, ThreadBuffers& s) const;
};

// bf16 backward-weights as one matmul: dW [K, C*kh*kw] = dY^T [K, Q] x col
// [Q, C*kh*kw] over the chunk's Q = mb * H' * W' output positions (oneDNN's
// brgemm, which oneDNN 2.6 has for matmul but not for this pass of a
// convolution). NCHW: dY^T and col^T, both transposed as they are
// gathered; NHWC: dY as it is ([Q, K]) and col [Q, ncol] with its columns
// in (i, j, c) order, so dW comes out [K, kh, kw, C].
struct MatmulWeightsPass {
  bool available = false;  // bf16 kernels, ungrouped, and the CPU has avx512_bf16
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;

  // Steps 1-4 (its operands are ours: no reorders). Throws dnnl::error.
  void Build(const Conv2dGeometry& g, int64_t mb, bool nhwc_in, bool nhwc_out,
             const dnnl::primitive_attr& attr);
  // x (f32, or kept_x: bf16 NHWC), dy (f32, or dy_bf16: bf16 NHWC) -> dw,
  // db (null: no bias).
  void Run(const Conv2dGeometry& g, int64_t mb, const OnednnConv::Options& o, const float* x,
           const float* dy, float* dw, float* db, const uint16_t* kept_x, const uint16_t* dy_bf16,
           ThreadBuffers& s) const;
};

}  // namespace cnnflow::cpu
