// OnednnConv's passes, one builder each (onednn_passes.h).
#include "ops/cpu/conv/onednn_passes.h"

#include <algorithm>
#include <bit>
#include <string>
#include <unordered_map>
#include <vector>

#include "ops/cpu/bf16_layout.h"
#include "ops/cpu/conv/lowering.h"
#include "ops/cpu/onednn.h"
#include "ops/error.h"

namespace cnnflow::cpu {

using dnnl::memory;
using dt = memory::data_type;
using Tag = memory::format_tag;
using Fwd = dnnl::convolution_forward;
using BwdData = dnnl::convolution_backward_data;
using BwdWeights = dnnl::convolution_backward_weights;

namespace {

constexpr auto kDirect = dnnl::algorithm::convolution_direct;

// Whether oneDNN picked its reference kernel ("ref:any"...): never worth taking.
bool IsReference(const char* impl_info) { return std::string(impl_info).rfind("ref", 0) == 0; }

// f32 words that hold md (bf16: half as many).
int64_t Words(const memory::desc& md) { return static_cast<int64_t>((md.get_size() + 3) / 4); }

// The convolution forward's descriptor (step 1's memory descriptors in
// place), of prop_kind `kind`.
Fwd::desc ForwardDesc(dnnl::prop_kind kind, const ConvDescs& md, const ConvDims& d,
                      const memory::desc& bias) {
  return Fwd::desc(kind, kDirect, md.src, md.weights, bias, md.dst, d.strides, d.dilates, d.pad_l,
                   d.pad_r);
}

}  // namespace

ConvDims::ConvDims(const Conv2dGeometry& g, int64_t mb)
    : grouped(g.groups > 1),
      src{mb, g.in_channels, g.in_h, g.in_w},
      dst{mb, g.out_channels, g.out_h, g.out_w},
      weights(grouped ? memory::dims{g.groups, g.out_per_group(), g.in_per_group(), g.kernel_h,
                                     g.kernel_w}
                      : memory::dims{g.out_channels, g.in_channels, g.kernel_h, g.kernel_w}),
      strides{g.stride_h, g.stride_w},
      dilates{g.dilation_h - 1, g.dilation_w - 1},
      pad_l{g.pad_h, g.pad_w},
      pad_r{(g.out_h - 1) * g.stride_h + (g.kernel_h - 1) * g.dilation_h + 1 - g.in_h - g.pad_h,
            (g.out_w - 1) * g.stride_w + (g.kernel_w - 1) * g.dilation_w + 1 - g.in_w - g.pad_w} {}

UserLayouts::UserLayouts(const ConvDims& d, bool nhwc_in, bool nhwc_out)
    : x(d.src, dt::f32, nhwc_in ? Tag::nhwc : Tag::nchw),
      y(d.dst, dt::f32, nhwc_out ? Tag::nhwc : Tag::nchw),
      weights(d.weights, dt::f32, d.grouped ? Tag::goihw : Tag::oihw),
      bias(memory::dims{d.dst[1]}, dt::f32, Tag::x),
      x_bf16(d.src, dt::bf16, Tag::nhwc),
      dy_bf16(d.dst, dt::bf16, Tag::nhwc) {}

ConvDescs::ConvDescs(const ConvDims& d, dt op, Tag act)
    : src(d.src, op, act),
      dst(d.dst, dt::f32, act),
      weights(d.weights, op, Tag::any),
      diff_dst(d.dst, op, act),
      diff_src(d.src, dt::f32, act),
      diff_weights(d.weights, dt::f32, Tag::any) {}

void* Fit(Tensor& t, size_t bytes) {
  const int64_t n = static_cast<int64_t>((bytes + 3) / 4) + 1;
  if (!t.defined() || t.numel() < n) t = Tensor::Empty({n}, DType::kF32);
  return t.raw_data();
}

size_t BufferBytes(const Reorder& r, const memory::desc& md) {
  return r.needed() ? md.get_size() : 0;
}

void ForwardPass::Describe(const ConvDescs& md, const ConvDims& d, const memory::desc& bias,
                           bool relu, const Fwd::primitive_desc& hint) {
  if (!relu) {
    pd = hint;
    return;
  }
  // Step 2: the ReLU as a post-op, in the kernel. A fresh attribute:
  // copies of a dnnl handle share one object.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  attr.set_post_ops(ops);
  // Step 3: a convolution needs no training workspace, so the forward may
  // be an inference primitive, which is where oneDNN 2.6 has the post-op.
  pd = Fwd::primitive_desc(ForwardDesc(dnnl::prop_kind::forward_inference, md, d, bias), attr,
                           OnednnEngine());
}

void ForwardPass::Build(const UserLayouts& user, bool bf16, const dnnl::primitive_attr& attr) {
  primitive = Fwd(pd);
  x_in = Reorder(user.x, pd.src_desc(), attr);
  y_out = Reorder(pd.dst_desc(), user.y, attr);
  weights.reorder = Reorder(user.weights, pd.weights_desc(), attr);
  if (weights.reorder.needed()) weights.buf = Tensor::Empty({Words(pd.weights_desc())});
  if (bf16) x16_in = Reorder(user.x_bf16, pd.src_desc(), attr);
}

void ForwardPass::Run(const void* src, const float* bias, float* y, const UserLayouts& user,
                      bool has_bias, ThreadBuffers& s) const {
  void* scratchpad = s.scratchpad.raw_data();
  void* dst = y_out.Out(y, s.reordered_out.raw_data());
  memory ms(pd.src_desc(), OnednnEngine(), const_cast<void*>(src));
  memory mw(pd.weights_desc(), OnednnEngine(), const_cast<void*>(weights.ptr));
  memory md(pd.dst_desc(), OnednnEngine(), dst);
  memory mp(pd.scratchpad_desc(), OnednnEngine(), scratchpad);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md}, {DNNL_ARG_SCRATCHPAD, mp}};
  if (has_bias) {
    CNNFLOW_ENFORCE(bias != nullptr, "OnednnConv::Forward: the layer has a bias");
    args.emplace(DNNL_ARG_BIAS, memory(user.bias, OnednnEngine(), const_cast<float*>(bias)));
  }
  primitive.execute(OnednnStream(), args);
  y_out.Finish(dst, y, scratchpad);
}

void BackwardDataPass::Describe(const ConvDescs& md, const ConvDims& d,
                                const dnnl::primitive_attr& attr, const Fwd::primitive_desc& hint) {
  pd = BwdData::primitive_desc(BwdData::desc(kDirect, md.diff_src, md.weights, md.diff_dst,
                                             d.strides, d.dilates, d.pad_l, d.pad_r),
                               attr, OnednnEngine(), hint);
}

void BackwardDataPass::Build(const UserLayouts& user, bool bf16, const dnnl::primitive_attr& attr) {
  primitive = BwdData(pd);
  dy_in = Reorder(user.y, pd.diff_dst_desc(), attr);
  dx_out = Reorder(pd.diff_src_desc(), user.x, attr);
  weights.reorder = Reorder(user.weights, pd.weights_desc(), attr);
  if (weights.reorder.needed()) weights.buf = Tensor::Empty({Words(pd.weights_desc())});
  if (bf16) dy16_in = Reorder(user.dy_bf16, pd.diff_dst_desc(), attr);
}

void BackwardDataPass::Run(const void* diff_dst, float* dx, ThreadBuffers& s) const {
  CNNFLOW_ENFORCE(weights.ptr != nullptr,
                  "OnednnConv: the backward-data before PrepareBackwardWeights");
  void* scratchpad = s.scratchpad.raw_data();
  void* diff_src = dx_out.Out(dx, s.reordered_out.raw_data());
  memory mdd(pd.diff_dst_desc(), OnednnEngine(), const_cast<void*>(diff_dst));
  memory mw(pd.weights_desc(), OnednnEngine(), const_cast<void*>(weights.ptr));
  memory mds(pd.diff_src_desc(), OnednnEngine(), diff_src);
  memory mp(pd.scratchpad_desc(), OnednnEngine(), scratchpad);
  primitive.execute(OnednnStream(), {{DNNL_ARG_DIFF_DST, mdd},
                                     {DNNL_ARG_WEIGHTS, mw},
                                     {DNNL_ARG_DIFF_SRC, mds},
                                     {DNNL_ARG_SCRATCHPAD, mp}});
  dx_out.Finish(diff_src, dx, scratchpad);
}

void BackwardWeightsPass::Describe(const ConvDescs& md, const ConvDims& d, const memory::desc& bias,
                                   const dnnl::primitive_attr& attr,
                                   const Fwd::primitive_desc& hint) {
  pd = BwdWeights::primitive_desc(
      BwdWeights::desc(kDirect, md.src, md.diff_weights, bias, md.diff_dst, d.strides, d.dilates,
                       d.pad_l, d.pad_r),
      attr, OnednnEngine(), hint);
}

void BackwardWeightsPass::Build(const UserLayouts& user, bool bf16,
                                const dnnl::primitive_attr& attr) {
  primitive = BwdWeights(pd);
  x_in = Reorder(user.x, pd.src_desc(), attr);
  dy_in = Reorder(user.y, pd.diff_dst_desc(), attr);
  dw_out = Reorder(pd.diff_weights_desc(), user.weights, attr);
  if (bf16) {
    x16_in = Reorder(user.x_bf16, pd.src_desc(), attr);
    dy16_in = Reorder(user.dy_bf16, pd.diff_dst_desc(), attr);
  }
}

void BackwardWeightsPass::Run(const void* src, const void* diff_dst, float* dw, float* db,
                              const UserLayouts& user, bool has_bias, ThreadBuffers& s) const {
  void* scratchpad = s.scratchpad.raw_data();
  void* diff_weights = dw_out.Out(dw, s.reordered_dw.raw_data());
  memory ms(pd.src_desc(), OnednnEngine(), const_cast<void*>(src));
  memory mdd(pd.diff_dst_desc(), OnednnEngine(), const_cast<void*>(diff_dst));
  memory mdw(pd.diff_weights_desc(), OnednnEngine(), diff_weights);
  memory mp(pd.scratchpad_desc(), OnednnEngine(), scratchpad);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, ms},
                                       {DNNL_ARG_DIFF_DST, mdd},
                                       {DNNL_ARG_DIFF_WEIGHTS, mdw},
                                       {DNNL_ARG_SCRATCHPAD, mp}};
  if (has_bias) {
    CNNFLOW_ENFORCE(db != nullptr, "OnednnConv::BackwardWeights: the layer has a bias");
    args.emplace(DNNL_ARG_DIFF_BIAS, memory(user.bias, OnednnEngine(), db));
  }
  primitive.execute(OnednnStream(), args);
  dw_out.Finish(diff_weights, dw, scratchpad);
}

void BuildConvolutionPasses(const ConvDims& d, const UserLayouts& user,
                            const OnednnConv::Options& o, dt op, bool direct,
                            const dnnl::primitive_attr& attr, ForwardPass& forward,
                            BackwardDataPass& backward_data,
                            BackwardWeightsPass& backward_weights) {
  const memory::desc bias = o.bias ? user.bias : memory::desc();
  for (const Tag act :
       direct ? std::vector<Tag>{Tag::nhwc, Tag::any} : std::vector<Tag>{Tag::any}) {
    const ConvDescs md(d, op, act);
    // The backward primitives take their hint from a forward without the
    // post-op.
    const Fwd::primitive_desc hint(ForwardDesc(dnnl::prop_kind::forward_training, md, d, bias),
                                   attr, OnednnEngine());
    forward.Describe(md, d, bias, o.relu, hint);
    backward_data.Describe(md, d, attr, hint);
    backward_weights.Describe(md, d, bias, attr, hint);
    if (!IsReference(forward.pd.impl_info_str()) &&
        !IsReference(backward_data.pd.impl_info_str()) &&
        !IsReference(backward_weights.pd.impl_info_str())) {
      break;
    }
  }
  forward.Build(user, o.bf16, attr);
  backward_data.Build(user, o.bf16, attr);
  backward_weights.Build(user, o.bf16, attr);
}

void FlippedDataPass::Build(const Conv2dGeometry& g, const ConvDims& d, const UserLayouts& user,
                            dt op, bool bf16_kernels, bool direct, bool bf16,
                            const dnnl::primitive_attr& attr) {
  const int64_t span_h = (g.kernel_h - 1) * g.dilation_h, span_w = (g.kernel_w - 1) * g.dilation_w;
  if (!(bf16_kernels || direct) || d.grouped || g.stride_h != 1 || g.stride_w != 1 ||
      d.pad_l[0] > span_h || d.pad_l[1] > span_w || d.pad_r[0] > span_h || d.pad_r[1] > span_w) {
    return;
  }
  // Step 1: dy is the source, dx the destination, and the weights w
  // flipped, [C, K, kh, kw]; f32 where both activations are channels-last
  // (oneDNN 2.6's f32 NHWC forward is brgemm, its backward-data jit).
  const Tag act = direct ? Tag::nhwc : Tag::any;
  const memory::dims flipped{g.in_channels, g.out_channels, g.kernel_h, g.kernel_w};
  // Step 3 (no post-ops).
  pd = Fwd::primitive_desc(
      Fwd::desc(dnnl::prop_kind::forward_inference, kDirect, memory::desc(d.dst, op, act),
                memory::desc(flipped, op, Tag::any), memory::desc(d.src, dt::f32, act), d.strides,
                d.dilates, memory::dims{span_h - d.pad_l[0], span_w - d.pad_l[1]},
                memory::dims{span_h - d.pad_r[0], span_w - d.pad_r[1]}),
      attr, OnednnEngine());
  available = !IsReference(pd.impl_info_str());
  if (!available) return;
  primitive = Fwd(pd);
  dy_in = Reorder(user.y, pd.src_desc(), attr);
  dx_out = Reorder(pd.dst_desc(), user.x, attr);
  if (bf16) dy16_in = Reorder(user.dy_bf16, pd.src_desc(), attr);
  // w flipped in space but in w's own order [K, C, kh, kw]: iohw of [C, K, kh, kw].
  weights.reorder = Reorder(memory::desc(flipped, dt::f32, Tag::iohw), pd.weights_desc(), attr);
  flipped_f32 = Tensor::Empty({g.in_channels * g.out_channels * g.kernel_h * g.kernel_w});
  weights.buf = Tensor::Empty({Words(pd.weights_desc())});
}

void FlippedDataPass::Prepare(const Conv2dGeometry& g, const float* w, bool f32_kernels,
                              void* scratchpad) {
  const int64_t kh = g.kernel_h, kw = g.kernel_w, taps = kh * kw;
  float* f = flipped_f32.data<float>();
  // The spatial flip here, in place of each (k, c) kernel; the swap of the
  // channel axes is the reorder's (from iohw).
  for (int64_t kc = 0; kc < g.out_channels * g.in_channels; ++kc) {
    const float* src = w + kc * taps;
    float* dst = f + kc * taps;
    for (int64_t t = 0; t < taps; ++t) dst[t] = src[taps - 1 - t];
  }
  if (f32_kernels) RoundToBf16(f, f, flipped_f32.numel());
  weights.ptr = weights.reorder.In(f, weights.buf.raw_data(), scratchpad);
}

void FlippedDataPass::Run(const void* diff_dst, float* dx, ThreadBuffers& s) const {
  CNNFLOW_ENFORCE(weights.ptr != nullptr,
                  "OnednnConv: the flipped backward-data before PrepareFlippedWeights");
  void* scratchpad = s.scratchpad.raw_data();
  void* dst = dx_out.Out(dx, s.reordered_out.raw_data());
  memory ms(pd.src_desc(), OnednnEngine(), const_cast<void*>(diff_dst));
  memory mw(pd.weights_desc(), OnednnEngine(), const_cast<void*>(weights.ptr));
  memory md(pd.dst_desc(), OnednnEngine(), dst);
  memory mp(pd.scratchpad_desc(), OnednnEngine(), scratchpad);
  primitive.execute(
      OnednnStream(),
      {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md}, {DNNL_ARG_SCRATCHPAD, mp}});
  dx_out.Finish(dst, dx, scratchpad);
}

void MatmulWeightsPass::Build(const Conv2dGeometry& g, int64_t mb, bool nhwc_in, bool nhwc_out,
                              const dnnl::primitive_attr& attr) {
  const int64_t q = mb * g.out_plane(), ncol = g.col_rows();
  // Steps 1 and 3: dY^T [K, Q] (NHWC: dY [Q, K] as it is), col [Q, ncol]
  // (NCHW: col^T), dW [K, ncol].
  pd = dnnl::matmul::primitive_desc(
      dnnl::matmul::desc(memory::desc({g.out_channels, q}, dt::bf16, nhwc_out ? Tag::ba : Tag::ab),
                         memory::desc({q, ncol}, dt::bf16, nhwc_in ? Tag::ab : Tag::ba),
                         memory::desc({g.out_channels, ncol}, dt::f32, Tag::ab)),
      attr, OnednnEngine());
  primitive = dnnl::matmul(pd);
  available = true;
}

void MatmulWeightsPass::Run(const Conv2dGeometry& g, int64_t mb, const OnednnConv::Options& o,
                            const float* x, const float* dy, float* dw, float* db,
                            const uint16_t* kept_x, const uint16_t* dy_bf16,
                            ThreadBuffers& s) const {
  const int64_t plane = g.out_plane(), q = mb * plane, k_out = g.out_channels;
  const int64_t x_size = mb * g.in_channels * g.in_plane();
  auto* col = static_cast<uint16_t*>(Fit(s.col, 2 * g.col_rows() * q));
  auto* dyt = dy_bf16 != nullptr ? const_cast<uint16_t*>(dy_bf16)
                                 : static_cast<uint16_t*>(Fit(s.dy_t, 2 * k_out * q));
  const uint16_t* xb = kept_x;
  if (xb == nullptr) {
    auto* buf = static_cast<uint16_t*>(Fit(s.x16, 2 * x_size));
    ToBf16(x, buf, x_size);
    xb = buf;
  }
  if (o.nhwc_in) {
    Im2ColNhwc(g, mb, xb, col);
  } else {
    Im2ColTransposed(g, mb, xb, col);
  }
  if (dy_bf16 == nullptr && o.nhwc_out) {
    ToBf16(dy, dyt, q * k_out);
  } else if (dy_bf16 == nullptr) {
    for (int64_t k = 0; k < k_out; ++k) {
      for (int64_t n = 0; n < mb; ++n)
        ToBf16(dy + (n * k_out + k) * plane, dyt + k * q + n * plane, plane);
    }
  }
  // From NHWC, dW comes out [K, kh, kw, C]: into [K, C, kh, kw] after.
  const int64_t taps = g.kernel_h * g.kernel_w, c_n = g.in_channels;
  float* out = o.nhwc_in ? static_cast<float*>(Fit(s.dw_t, 4 * k_out * c_n * taps)) : dw;
  memory ms(pd.src_desc(), OnednnEngine(), dyt);
  memory mw(pd.weights_desc(), OnednnEngine(), col);
  memory md(pd.dst_desc(), OnednnEngine(), out);
  memory mp(pd.scratchpad_desc(), OnednnEngine(), s.scratchpad.data<float>());
  primitive.execute(
      OnednnStream(),
      {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md}, {DNNL_ARG_SCRATCHPAD, mp}});
  if (o.nhwc_in) {
    for (int64_t k = 0; k < k_out; ++k)
      for (int64_t t = 0; t < taps; ++t)
        for (int64_t c = 0; c < c_n; ++c)
          dw[(k * c_n + c) * taps + t] = out[(k * taps + t) * c_n + c];
  }
  if (o.bias) {
    CNNFLOW_ENFORCE(db != nullptr, "OnednnConv::BackwardWeightsByMatmul: the layer has a bias");
    if (o.nhwc_out) {
      // Column sums of dY [Q, K] in bf16, in row order.
      std::fill_n(db, k_out, 0.0f);
      for (int64_t r = 0; r < q; ++r)
        for (int64_t k = 0; k < k_out; ++k)
          db[k] += std::bit_cast<float>(static_cast<uint32_t>(dyt[r * k_out + k]) << 16);
    } else {
      for (int64_t k = 0; k < k_out; ++k) db[k] = SumBf16(dyt + k * q, q);
    }
  }
}

}  // namespace cnnflow::cpu
