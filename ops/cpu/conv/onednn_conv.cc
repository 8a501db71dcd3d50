#include "ops/cpu/conv/onednn_conv.h"

#include <tbb/enumerable_thread_specific.h>

#include <algorithm>
#include <bit>
#include <dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "ops/cpu/bf16_layout.h"
#include "ops/cpu/onednn.h"
#include "ops/error.h"
#include "ops/tensor.h"

namespace cnnflow::cpu {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

// A reorder from `from` to `to`, or nothing when they are the same layout.
// The ones that bf16 convolutions run on every activation, f32 NCHW or NHWC
// to bf16 NHWC, f32 NHWC to NCHW and bf16 NHWC to f32 NHWC (the f32
// kernels'), are our own (ops/cpu/bf16_layout.h).
struct Reorder {
  enum class Kind { kNone, kOnednn, kNchwToNhwcBf16, kNhwcToBf16, kNhwcToNchw, kBf16ToNhwc };
  Reorder() = default;
  Reorder(const memory::desc& from, const memory::desc& to, const dnnl::primitive_attr& attr)
      : from(from), to(to) {
    if (from == to) return;
    const memory::dims d = from.dims();
    if (d.size() == 4 && CpuHasAvx512Bf16()) {
      using dt = memory::data_type;
      auto plain = [&](dt type, Tag tag) { return memory::desc(d, type, tag); };
      if (from == plain(dt::f32, Tag::nchw) && to == plain(dt::bf16, Tag::nhwc)) {
        kind = Kind::kNchwToNhwcBf16;
      } else if (from == plain(dt::f32, Tag::nhwc) && to == plain(dt::bf16, Tag::nhwc)) {
        kind = Kind::kNhwcToBf16;
      } else if (from == plain(dt::f32, Tag::nhwc) && to == plain(dt::f32, Tag::nchw)) {
        kind = Kind::kNhwcToNchw;
      } else if (from == plain(dt::bf16, Tag::nhwc) && to == plain(dt::f32, Tag::nhwc)) {
        kind = Kind::kBf16ToNhwc;
      }
      if (kind != Kind::kNone) {
        n = d[0];
        c = d[1];
        p = d[2] * d[3];
        return;
      }
    }
    kind = Kind::kOnednn;
    pd = dnnl::reorder::primitive_desc(OnednnEngine(), from, OnednnEngine(), to, attr);
    prim = dnnl::reorder(pd);
  }
  bool needed() const { return kind != Kind::kNone; }
  // Whether it writes bf16 NHWC by our own conversion (from NCHW or NHWC).
  bool ToBf16Nhwc() const { return kind == Kind::kNchwToNhwcBf16 || kind == Kind::kNhwcToBf16; }
  size_t scratchpad() const { return prim ? pd.scratchpad_desc().get_size() : 0; }
  // An input `p` laid out as `from`: what the primitive reads (p itself, or
  // buf after the reorder).
  const void* In(const void* p, void* buf, void* pad) const {
    if (!needed()) return p;
    Run(p, buf, pad);
    return buf;
  }
  // Where the primitive writes an output bound for `p`: p itself, or buf,
  // which Finish then reorders into p.
  void* Out(void* p, void* buf) const { return needed() ? buf : p; }
  void Finish(const void* buf, void* p, void* pad) const {
    if (needed()) Run(buf, p, pad);
  }
  // Runs it from `src` into `dst`: pointers laid out as `from` and `to`.
  void Run(const void* src, void* dst, void* pad) const {
    if (kind == Kind::kNchwToNhwcBf16) {
      NchwToNhwcBf16(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n, c, p);
      return;
    }
    if (kind == Kind::kNhwcToBf16) {
      ToBf16(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n * c * p);
      return;
    }
    if (kind == Kind::kNhwcToNchw) {
      NhwcToNchw(static_cast<const float*>(src), static_cast<float*>(dst), n, c, p);
      return;
    }
    if (kind == Kind::kBf16ToNhwc) {
      FromBf16(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n * c * p);
      return;
    }
    memory s(from, OnednnEngine(), const_cast<void*>(src)), d(to, OnednnEngine(), dst);
    memory p(pd.scratchpad_desc(), OnednnEngine(), pad);
    prim.execute(OnednnStream(), {{DNNL_ARG_FROM, s}, {DNNL_ARG_TO, d}, {DNNL_ARG_SCRATCHPAD, p}});
  }

  memory::desc from, to;
  Kind kind = Kind::kNone;
  int64_t n = 0, c = 0, p = 0;  // our own kinds: [n, c, p] in NCHW terms
  dnnl::reorder::primitive_desc pd;
  dnnl::reorder prim;
};

// Whether oneDNN picked its reference kernel ("ref:any"...): never worth taking.
bool IsReference(const char* impl_info) { return std::string(impl_info).rfind("ref", 0) == 0; }

// The size in bytes of a buffer laid out as md (0 when `r` needs none).
size_t BufferBytes(const Reorder& r, const memory::desc& md) {
  return r.needed() ? md.get_size() : 0;
}

// xb [mb, C, H, W] bf16 -> col^T [C * kh * kw, mb * H' * W'] (row r =
// (c, i, j), column q = (s, oh, ow)): bf16 words copied, zero outside x.
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

// xb [mb, H, W, C] bf16 -> col [mb * H' * W', kh * kw * C] (row q = (s, oh,
// ow), column (i, j, c)): each tap a copy of C contiguous words, zero
// outside x.
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

}  // namespace

struct OnednnConv::Impl {
  memory::desc user_src, user_wei, user_dst, user_bias;
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights_pd;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights bwd_weights;
  bool bias = false;
  Conv2dGeometry g;
  int64_t mb = 0;
  bool nhwc_in = false, nhwc_out = false;  // x, dx [mb, H, W, C]; y, dy [mb, H', W', K]

  // bf16 backward-weights as one matmul (BackwardWeightsByMatmul): dW [K, C*kh*kw]
  // = dY^T [K, Q] x col [Q, C*kh*kw] over the chunk's Q = mb * H' * W'
  // output positions, col stored transposed (im2col of the plain x).
  bool matmul_weights = false;
  dnnl::matmul::primitive_desc mm_pd;
  dnnl::matmul mm;

  // The backward-data of a stride-1 convolution as a forward one
  // (BackwardDataByFlippedForward): dx = conv(dy, w flipped in space with
  // its channel axes swapped), padded by dilation * (k - 1) - pad, which
  // runs on oneDNN's brgemm forward kernels.
  bool flipped_data = false;
  dnnl::convolution_forward::primitive_desc flip_pd;
  dnnl::convolution_forward flip;
  Reorder flip_src, flip_dst, flip_wei;
  Tensor flip_wei_f32, flip_wei_buf;  // w flipped in space, [K, C, kh, kw]; in flip_pd's layout
  const void* flip_wei_ptr = nullptr;

  // Per call: user -> primitive layouts and back.
  Reorder fwd_src, fwd_dst, bd_diff_dst, bd_diff_src, bw_src, bw_diff_dst, bw_diff_wei;
  // bf16: x given in bf16 NHWC (kept by Forward, or a bf16 activation) to
  // the forward's and backward-weights' layouts, and dy (converted once, or
  // a bf16 gradient) to the backward passes' (nothing where they read it so).
  bool bf16 = false;
  Reorder fwd_src16, bw_src16, bd_diff_dst16, bw_diff_dst16, flip_src16;
  // bf16 on the f32 kernels: an f32 x or dy is first rounded to bf16 NHWC
  // (src_to16, dst_to16), and the weights to bf16 values in f32, so that the
  // kernels multiply the operands the bf16 kernels would.
  bool f32_kernels = false;
  Reorder src_to16, dst_to16;
  // f32_kernels whose backward passes all read dy in its own layout
  // (channels-last x and y, on oneDNN's direct kernels): Backward rounds dy
  // to bf16 values in f32 once for both passes (8 bytes an element moved),
  // where each pass would widen a bf16 copy again (6 + 2 x 6).
  bool dy_rounded_once = false;
  Tensor fwd_wei_rounded, bd_wei_rounded;  // the rounded weights, where no reorder copies them
  // Per pass: the weights in the forward and backward-data layouts.
  Reorder fwd_wei, bd_wei;
  Tensor fwd_wei_buf, bd_wei_buf;
  const void* fwd_wei_ptr = nullptr;
  const void* bd_wei_ptr = nullptr;

  size_t buf_a = 0, buf_b = 0, buf_c = 0, pad = 0;  // per-thread scratch sizes (bytes)
  struct Scratch {
    Tensor a, b, c, pad;
    Tensor col, dyt, xb;  // matmul_weights: col (transposed for NCHW), dY and x in bf16;
                          // f32_kernels: x in bf16 (xb)
    Tensor dwt;           // matmul_weights from NHWC: dW [K, kh, kw, C]
    Tensor dy16;          // Backward: dy in bf16 NHWC, for both passes
    Tensor dy_rounded;    // dy_rounded_once: dy rounded to bf16 values, in f32
    Tensor wei_rounded;   // f32_kernels: the rounded weights on their way to a reorder
  };
  mutable tbb::enumerable_thread_specific<Scratch> scratch;

  // t, grown to hold at least `bytes`; its data.
  static void* Fit(Tensor& t, size_t bytes) {
    const int64_t n = static_cast<int64_t>((bytes + 3) / 4) + 1;
    if (!t.defined() || t.numel() < n) t = Tensor::Empty({n}, DType::kF32);
    return t.raw_data();
  }
  // f32_kernels: p (laid out as r.from) rounded to bf16 NHWC in buf.
  static const uint16_t* RoundedOperand(const Reorder& r, const float* p, Tensor& buf, void* pad) {
    auto* out = static_cast<uint16_t*>(Fit(buf, r.to.get_size()));
    r.Run(p, out, pad);
    return out;
  }
  // The weights a pass reorders by `r` (f32_kernels: rounded to bf16 values
  // first, in this thread's scratch, or in `kept` where nothing copies them).
  const float* WeightsFor(const Reorder& r, const float* w, Tensor& kept) {
    if (!f32_kernels) return w;
    const int64_t n = g.out_channels * g.in_per_group() * g.kernel_h * g.kernel_w;
    Tensor& out = r.needed() ? Local().wei_rounded : kept;
    if (!out.defined() || out.numel() < n) out = Tensor::Empty({n});
    RoundToBf16(w, out.data<float>(), n);
    return out.data<float>();
  }
  Scratch& Local() const {
    Scratch& s = scratch.local();
    Fit(s.a, buf_a);
    Fit(s.b, buf_b);
    Fit(s.c, buf_c);
    Fit(s.pad, pad);
    return s;
  }
  // Whether the forward reads every x as bf16 NHWC (the f32 kernels: rounded
  // so; the bf16 ones: converted so by our own reorder).
  bool ForwardReadsBf16Nhwc() const { return f32_kernels || fwd_src.ToBf16Nhwc(); }

  // dy as a backward pass is given it: in bf16 NHWC (bf16), else in f32,
  // where `rounded` says it holds bf16 values already (dy_rounded_once).
  struct Dy {
    const float* f32 = nullptr;
    const uint16_t* bf16 = nullptr;
    bool rounded = false;
  };
  // A backward pass's dy in its primitive's layout (in buf where a reorder
  // writes it): dy.bf16 by r16, else dy.f32 by r32 (f32_kernels, unless
  // rounded: rounded to bf16 NHWC first, then by r16).
  const void* DiffDst(const Reorder& r32, const Reorder& r16, Dy dy, void* buf, Scratch& s) const {
    void* pad = s.pad.raw_data();
    if (f32_kernels && !dy.rounded && dy.bf16 == nullptr)
      dy.bf16 = RoundedOperand(dst_to16, dy.f32, s.dy16, pad);
    return dy.bf16 != nullptr ? r16.In(dy.bf16, buf, pad) : r32.In(dy.f32, buf, pad);
  }
  // The backward-weights' x in its primitive's layout (in s.a where a
  // reorder writes it), as DiffDst.
  const void* WeightsPassSrc(const float* x, const uint16_t* x_bf16, Scratch& s) const {
    void* pad = s.pad.raw_data();
    if (f32_kernels && x_bf16 == nullptr) x_bf16 = RoundedOperand(src_to16, x, s.xb, pad);
    return x_bf16 != nullptr ? bw_src16.In(x_bf16, s.a.raw_data(), pad)
                             : bw_src.In(x, s.a.raw_data(), pad);
  }

  // The backward passes on operands in their primitives' layouts; the
  // results into dx (through s.b), dw (through s.c) and db.
  void RunBackwardData(const void* diff_dst, float* dx, Scratch& s) const {
    CNNFLOW_ENFORCE(bd_wei_ptr != nullptr,
                    "OnednnConv: the backward-data before PrepareBackwardWeights");
    void* pad = s.pad.raw_data();
    void* diff_src = bd_diff_src.Out(dx, s.b.raw_data());
    const auto& pd = bwd_data_pd;
    memory mdd(pd.diff_dst_desc(), OnednnEngine(), const_cast<void*>(diff_dst));
    memory mw(pd.weights_desc(), OnednnEngine(), const_cast<void*>(bd_wei_ptr));
    memory mds(pd.diff_src_desc(), OnednnEngine(), diff_src);
    memory mp(pd.scratchpad_desc(), OnednnEngine(), pad);
    bwd_data.execute(OnednnStream(), {{DNNL_ARG_DIFF_DST, mdd},
                                      {DNNL_ARG_WEIGHTS, mw},
                                      {DNNL_ARG_DIFF_SRC, mds},
                                      {DNNL_ARG_SCRATCHPAD, mp}});
    bd_diff_src.Finish(diff_src, dx, pad);
  }
  void RunFlipped(const void* src, float* dx, Scratch& s) const {
    CNNFLOW_ENFORCE(flip_wei_ptr != nullptr,
                    "OnednnConv: the flipped backward-data before PrepareFlippedWeights");
    void* pad = s.pad.raw_data();
    void* dst = flip_dst.Out(dx, s.b.raw_data());
    const auto& pd = flip_pd;
    memory ms(pd.src_desc(), OnednnEngine(), const_cast<void*>(src));
    memory mw(pd.weights_desc(), OnednnEngine(), const_cast<void*>(flip_wei_ptr));
    memory md(pd.dst_desc(), OnednnEngine(), dst);
    memory mp(pd.scratchpad_desc(), OnednnEngine(), pad);
    flip.execute(OnednnStream(), {{DNNL_ARG_SRC, ms},
                                  {DNNL_ARG_WEIGHTS, mw},
                                  {DNNL_ARG_DST, md},
                                  {DNNL_ARG_SCRATCHPAD, mp}});
    flip_dst.Finish(dst, dx, pad);
  }
  void RunBackwardWeights(const void* src, const void* diff_dst, float* dw, float* db,
                          Scratch& s) const {
    void* pad = s.pad.raw_data();
    void* diff_wei = bw_diff_wei.Out(dw, s.c.raw_data());
    const auto& pd = bwd_weights_pd;
    memory ms(pd.src_desc(), OnednnEngine(), const_cast<void*>(src));
    memory mdd(pd.diff_dst_desc(), OnednnEngine(), const_cast<void*>(diff_dst));
    memory mdw(pd.diff_weights_desc(), OnednnEngine(), diff_wei);
    memory mp(pd.scratchpad_desc(), OnednnEngine(), pad);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, ms},
                                         {DNNL_ARG_DIFF_DST, mdd},
                                         {DNNL_ARG_DIFF_WEIGHTS, mdw},
                                         {DNNL_ARG_SCRATCHPAD, mp}};
    if (bias) {
      CNNFLOW_ENFORCE(db != nullptr, "OnednnConv::BackwardWeights: the layer has a bias");
      args.emplace(DNNL_ARG_DIFF_BIAS, memory(user_bias, OnednnEngine(), db));
    }
    bwd_weights.execute(OnednnStream(), args);
    bw_diff_wei.Finish(diff_wei, dw, pad);
  }
};

OnednnConv::OnednnConv(const Conv2dGeometry& g, int64_t mb, bool bias, bool relu, bool bf16,
                       bool nhwc_in, bool nhwc_out, bool f32_kernels)
    : mb_(mb), impl_(std::make_unique<Impl>()) {
  // oneDNN sizes a primitive's OpenMP team when it creates the primitive,
  // from this thread's max threads: pinned after creation, a primitive made
  // here would still run on a team of every core, beside TBB's threads.
  OneOpenMpThreadHere();
  Impl& m = *impl_;
  m.bias = bias;
  m.g = g;
  m.mb = mb;
  m.nhwc_in = nhwc_in;
  m.nhwc_out = nhwc_out;
  using dt = memory::data_type;
  const memory::dims src{mb, g.in_channels, g.in_h, g.in_w};
  const memory::dims dst{mb, g.out_channels, g.out_h, g.out_w};
  const bool grouped = g.groups > 1;
  const memory::dims wei =
      grouped ? memory::dims{g.groups, g.out_per_group(), g.in_per_group(), g.kernel_h, g.kernel_w}
              : memory::dims{g.out_channels, g.in_channels, g.kernel_h, g.kernel_w};
  const memory::dims strides{g.stride_h, g.stride_w};
  const memory::dims dilates{g.dilation_h - 1, g.dilation_w - 1};
  const memory::dims pad_l{g.pad_h, g.pad_w};
  // The right padding that gives the floor output size (may be below pad_l).
  const memory::dims pad_r{
      (g.out_h - 1) * g.stride_h + (g.kernel_h - 1) * g.dilation_h + 1 - g.in_h - g.pad_h,
      (g.out_w - 1) * g.stride_w + (g.kernel_w - 1) * g.dilation_w + 1 - g.in_w - g.pad_w};
  m.user_src = memory::desc(src, dt::f32, nhwc_in ? Tag::nhwc : Tag::nchw);
  m.user_dst = memory::desc(dst, dt::f32, nhwc_out ? Tag::nhwc : Tag::nchw);
  m.user_wei = memory::desc(wei, dt::f32, grouped ? Tag::goihw : Tag::oihw);
  m.user_bias = memory::desc({g.out_channels}, dt::f32, Tag::x);
  CNNFLOW_ENFORCE(bf16 || !f32_kernels, "OnednnConv: f32 kernels for bf16 operands only");
  // The operands of the products (x, w, dy) in the kernels' type; the
  // results (y, dx, dw) in f32.
  const bool bf16_kernels = bf16 && !f32_kernels;
  const dt op = bf16_kernels ? dt::bf16 : dt::f32;
  // f32 channels-last tensors are read and written as they are where
  // oneDNN has kernels for that (its brgemm forward and jit backward ones on
  // AVX-512, when x and y are both channels-last): a reorder to its blocked
  // layout and back costs ~20% of a pass. Elsewhere (its reference kernels
  // would be picked) and for bf16 kernels, whose operands are converted on
  // the way in anyway, oneDNN picks the layouts (format_tag::any).
  const bool direct = !bf16_kernels && nhwc_in && nhwc_out;
  const memory::desc no_bias;

  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // + ReLU as a post-op, in the kernel. A fresh attribute: copies of a dnnl
  // handle share one object.
  dnnl::primitive_attr fwd_attr;
  fwd_attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (relu) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    fwd_attr.set_post_ops(ops);
  }
  try {
    using Fwd = dnnl::convolution_forward;
    using BwdData = dnnl::convolution_backward_data;
    using BwdWeights = dnnl::convolution_backward_weights;
    const auto algo = dnnl::algorithm::convolution_direct;
    for (const Tag act :
         direct ? std::vector<Tag>{Tag::nhwc, Tag::any} : std::vector<Tag>{Tag::any}) {
      const memory::desc src_md(src, op, act), dst_md(dst, dt::f32, act);
      const memory::desc wei_md(wei, op, Tag::any), diff_dst_md(dst, op, act);
      const memory::desc diff_src_md(src, dt::f32, act), diff_wei_md(wei, dt::f32, Tag::any);
      auto fwd_desc = [&](dnnl::prop_kind kind) {
        return Fwd::desc(kind, algo, src_md, wei_md, bias ? m.user_bias : no_bias, dst_md, strides,
                         dilates, pad_l, pad_r);
      };
      // The backward primitives take their hint from a forward without the
      // post-op; a convolution needs no training workspace, so the forward
      // itself may be an inference primitive, which is where oneDNN 2.6 has
      // the ReLU post-op.
      const Fwd::primitive_desc hint(fwd_desc(dnnl::prop_kind::forward_training), attr,
                                     OnednnEngine());
      m.fwd_pd = relu ? Fwd::primitive_desc(fwd_desc(dnnl::prop_kind::forward_inference), fwd_attr,
                                            OnednnEngine())
                      : hint;
      m.bwd_data_pd = BwdData::primitive_desc(
          BwdData::desc(algo, diff_src_md, wei_md, diff_dst_md, strides, dilates, pad_l, pad_r),
          attr, OnednnEngine(), hint);
      m.bwd_weights_pd = BwdWeights::primitive_desc(
          BwdWeights::desc(algo, src_md, diff_wei_md, bias ? m.user_bias : no_bias, diff_dst_md,
                           strides, dilates, pad_l, pad_r),
          attr, OnednnEngine(), hint);
      if (!IsReference(m.fwd_pd.impl_info_str()) && !IsReference(m.bwd_data_pd.impl_info_str()) &&
          !IsReference(m.bwd_weights_pd.impl_info_str())) {
        break;
      }
    }
    m.fwd = Fwd(m.fwd_pd);
    m.bwd_data = BwdData(m.bwd_data_pd);
    m.bwd_weights = BwdWeights(m.bwd_weights_pd);

    m.fwd_src = Reorder(m.user_src, m.fwd_pd.src_desc(), attr);
    m.fwd_dst = Reorder(m.fwd_pd.dst_desc(), m.user_dst, attr);
    m.fwd_wei = Reorder(m.user_wei, m.fwd_pd.weights_desc(), attr);
    m.bd_diff_dst = Reorder(m.user_dst, m.bwd_data_pd.diff_dst_desc(), attr);
    m.bd_diff_src = Reorder(m.bwd_data_pd.diff_src_desc(), m.user_src, attr);
    m.bd_wei = Reorder(m.user_wei, m.bwd_data_pd.weights_desc(), attr);
    m.bw_src = Reorder(m.user_src, m.bwd_weights_pd.src_desc(), attr);
    m.bw_diff_dst = Reorder(m.user_dst, m.bwd_weights_pd.diff_dst_desc(), attr);
    m.bw_diff_wei = Reorder(m.bwd_weights_pd.diff_weights_desc(), m.user_wei, attr);
    if (bf16) {
      const memory::desc user_src16(src, dt::bf16, Tag::nhwc);
      m.bf16 = true;
      m.fwd_src16 = Reorder(user_src16, m.fwd_pd.src_desc(), attr);
      m.bw_src16 = Reorder(user_src16, m.bwd_weights_pd.src_desc(), attr);
      const memory::desc user_dst16(dst, dt::bf16, Tag::nhwc);
      m.bd_diff_dst16 = Reorder(user_dst16, m.bwd_data_pd.diff_dst_desc(), attr);
      m.bw_diff_dst16 = Reorder(user_dst16, m.bwd_weights_pd.diff_dst_desc(), attr);
      m.f32_kernels = f32_kernels;
      if (f32_kernels) {
        m.src_to16 = Reorder(m.user_src, user_src16, attr);
        m.dst_to16 = Reorder(m.user_dst, user_dst16, attr);
      }
    }
  } catch (const dnnl::error& e) {
    throw Error(StrCat("oneDNN has no ", bf16_kernels ? "bf16 " : "", "convolution for input [", mb,
                       ", ", g.in_channels, ", ", g.in_h, ", ", g.in_w, "], kernel ", g.kernel_h,
                       "x", g.kernel_w, " stride ", g.stride_h, "x", g.stride_w, " groups ",
                       g.groups, ": ", e.what()));
  }
  m.buf_a = std::max({BufferBytes(m.fwd_src, m.fwd_pd.src_desc()),
                      BufferBytes(m.bd_diff_dst, m.bwd_data_pd.diff_dst_desc()),
                      BufferBytes(m.bw_src, m.bwd_weights_pd.src_desc()),
                      BufferBytes(m.fwd_src16, m.fwd_pd.src_desc()),
                      BufferBytes(m.bw_src16, m.bwd_weights_pd.src_desc()),
                      BufferBytes(m.bd_diff_dst16, m.bwd_data_pd.diff_dst_desc())});
  m.buf_b = std::max({BufferBytes(m.fwd_dst, m.fwd_pd.dst_desc()),
                      BufferBytes(m.bd_diff_src, m.bwd_data_pd.diff_src_desc()),
                      BufferBytes(m.bw_diff_dst, m.bwd_weights_pd.diff_dst_desc()),
                      BufferBytes(m.bw_diff_dst16, m.bwd_weights_pd.diff_dst_desc())});
  m.buf_c = BufferBytes(m.bw_diff_wei, m.bwd_weights_pd.diff_weights_desc());
  m.pad =
      std::max({m.fwd_pd.scratchpad_desc().get_size(), m.bwd_data_pd.scratchpad_desc().get_size(),
                m.bwd_weights_pd.scratchpad_desc().get_size(), m.fwd_src.scratchpad(),
                m.fwd_dst.scratchpad(), m.bd_diff_dst.scratchpad(), m.bd_diff_src.scratchpad(),
                m.bw_src.scratchpad(), m.bw_diff_dst.scratchpad(), m.bw_diff_wei.scratchpad(),
                m.fwd_wei.scratchpad(), m.bd_wei.scratchpad(), m.fwd_src16.scratchpad(),
                m.bw_src16.scratchpad(), m.bd_diff_dst16.scratchpad(), m.bw_diff_dst16.scratchpad(),
                m.src_to16.scratchpad(), m.dst_to16.scratchpad()});
  auto words = [](const memory::desc& md) {  // f32 words that hold md (bf16: half as many)
    return static_cast<int64_t>((md.get_size() + 3) / 4);
  };
  const int64_t span_h = (g.kernel_h - 1) * g.dilation_h, span_w = (g.kernel_w - 1) * g.dilation_w;
  const memory::dims flip_wei{g.in_channels, g.out_channels, g.kernel_h, g.kernel_w};
  // The flipped backward-data: bf16 kernels, or f32 where both activations
  // are channels-last (oneDNN 2.6's f32 NHWC forward is brgemm, its backward-data jit).
  if ((bf16_kernels || direct) && !grouped && g.stride_h == 1 && g.stride_w == 1 &&
      pad_l[0] <= span_h && pad_l[1] <= span_w && pad_r[0] <= span_h && pad_r[1] <= span_w) {
    const Tag act = direct ? Tag::nhwc : Tag::any;
    m.flip_pd = dnnl::convolution_forward::primitive_desc(
        dnnl::convolution_forward::desc(
            dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
            memory::desc(dst, op, act), memory::desc(flip_wei, op, Tag::any),
            memory::desc(src, dt::f32, act), strides, dilates,
            memory::dims{span_h - pad_l[0], span_w - pad_l[1]},
            memory::dims{span_h - pad_r[0], span_w - pad_r[1]}),
        attr, OnednnEngine());
    m.flipped_data = !IsReference(m.flip_pd.impl_info_str());
  }
  if (m.flipped_data) {
    m.flip = dnnl::convolution_forward(m.flip_pd);
    m.flip_src = Reorder(m.user_dst, m.flip_pd.src_desc(), attr);
    m.flip_dst = Reorder(m.flip_pd.dst_desc(), m.user_src, attr);
    if (bf16) {
      m.flip_src16 = Reorder(memory::desc(dst, dt::bf16, Tag::nhwc), m.flip_pd.src_desc(), attr);
    }
    // w flipped in space but in w's own order [K, C, kh, kw]: iohw of flip_wei.
    const memory::desc user_flip_wei(flip_wei, dt::f32, Tag::iohw);
    m.flip_wei = Reorder(user_flip_wei, m.flip_pd.weights_desc(), attr);
    m.flip_wei_f32 = Tensor::Empty({g.in_channels * g.out_channels * g.kernel_h * g.kernel_w});
    m.flip_wei_buf =
        Tensor::Empty({static_cast<int64_t>((m.flip_pd.weights_desc().get_size() + 3) / 4)});
    m.buf_a = std::max({m.buf_a, BufferBytes(m.flip_src, m.flip_pd.src_desc()),
                        BufferBytes(m.flip_src16, m.flip_pd.src_desc())});
    m.buf_b = std::max(m.buf_b, BufferBytes(m.flip_dst, m.flip_pd.dst_desc()));
    m.pad = std::max({m.pad, m.flip_pd.scratchpad_desc().get_size(), m.flip_src.scratchpad(),
                      m.flip_dst.scratchpad(), m.flip_wei.scratchpad(), m.flip_src16.scratchpad()});
  }
  if (bf16_kernels && !grouped && CpuHasAvx512Bf16()) {
    // NCHW: dY^T [K, Q] and col^T [ncol, Q], both transposed as they are
    // gathered; NHWC: dY as it is ([Q, K]) and col [Q, ncol] with its
    // columns in (i, j, c) order, so dW comes out [K, kh, kw, C].
    const int64_t q = mb * g.out_plane(), ncol = g.col_rows();
    m.mm_pd = dnnl::matmul::primitive_desc(
        dnnl::matmul::desc(
            memory::desc({g.out_channels, q}, dt::bf16, nhwc_out ? Tag::ba : Tag::ab),
            memory::desc({q, ncol}, dt::bf16, nhwc_in ? Tag::ab : Tag::ba),
            memory::desc({g.out_channels, ncol}, dt::f32, Tag::ab)),
        attr, OnednnEngine());
    m.mm = dnnl::matmul(m.mm_pd);
    m.pad = std::max(m.pad, m.mm_pd.scratchpad_desc().get_size());
    m.matmul_weights = true;
  }
  m.dy_rounded_once = f32_kernels && !m.bd_diff_dst.needed() && !m.bw_diff_dst.needed() &&
                      (!m.flipped_data || !m.flip_src.needed());
  if (m.fwd_wei.needed()) m.fwd_wei_buf = Tensor::Empty({words(m.fwd_pd.weights_desc())});
  if (m.bd_wei.needed()) m.bd_wei_buf = Tensor::Empty({words(m.bwd_data_pd.weights_desc())});
}

OnednnConv::~OnednnConv() = default;

std::string OnednnConv::ImplInfo() const {
  return StrCat("forward ", impl_->fwd_pd.impl_info_str(), ", backward-data ",
                impl_->bwd_data_pd.impl_info_str(), ", backward-weights ",
                impl_->bwd_weights_pd.impl_info_str());
}

void OnednnConv::PrepareForwardWeights(const float* w) {
  OneOpenMpThreadHere();
  Impl& m = *impl_;
  m.fwd_wei_ptr = m.fwd_wei.In(m.WeightsFor(m.fwd_wei, w, m.fwd_wei_rounded),
                               m.fwd_wei_buf.raw_data(), m.Local().pad.data<float>());
}

void OnednnConv::PrepareBackwardWeights(const float* w) {
  OneOpenMpThreadHere();
  Impl& m = *impl_;
  m.bd_wei_ptr = m.bd_wei.In(m.WeightsFor(m.bd_wei, w, m.bd_wei_rounded), m.bd_wei_buf.raw_data(),
                             m.Local().pad.data<float>());
}

bool OnednnConv::KeepsInput(ConvAlgo weights) const {
  const Impl& m = *impl_;
  return m.ForwardReadsBf16Nhwc() &&
         (weights == ConvAlgo::kMatmul ? m.nhwc_in && m.matmul_weights
                                       : m.f32_kernels || m.bw_src.ToBf16Nhwc());
}

void OnednnConv::Forward(const float* x, const float* bias, float* y, uint16_t* keep_x,
                         const uint16_t* x_bf16) const {
  OneOpenMpThreadHere();
  const Impl& m = *impl_;
  CNNFLOW_ENFORCE(m.fwd_wei_ptr != nullptr, "OnednnConv::Forward before PrepareForwardWeights");
  CNNFLOW_ENFORCE(keep_x == nullptr || (m.ForwardReadsBf16Nhwc() && x_bf16 == nullptr),
                  "OnednnConv::Forward: keep_x where the input is not converted to bf16 NHWC");
  CNNFLOW_ENFORCE(x_bf16 == nullptr || m.bf16, "OnednnConv::Forward: a bf16 x for an f32 kernel");
  Impl::Scratch& s = m.Local();
  void* pad = s.pad.data<float>();
  if (m.f32_kernels && x_bf16 == nullptr && keep_x != nullptr) {
    m.src_to16.Run(x, keep_x, pad);
    x_bf16 = keep_x;
  } else if (m.f32_kernels && x_bf16 == nullptr) {
    x_bf16 = Impl::RoundedOperand(m.src_to16, x, s.xb, pad);
  }
  const void* src = x_bf16 != nullptr
                        ? m.fwd_src16.In(x_bf16, s.a.raw_data(), pad)
                        : m.fwd_src.In(x, keep_x != nullptr ? keep_x : s.a.raw_data(), pad);
  void* dst = m.fwd_dst.Out(y, s.b.raw_data());
  const auto& pd = m.fwd_pd;
  memory ms(pd.src_desc(), OnednnEngine(), const_cast<void*>(src));
  memory mw(pd.weights_desc(), OnednnEngine(), const_cast<void*>(m.fwd_wei_ptr));
  memory md(pd.dst_desc(), OnednnEngine(), dst);
  memory mp(pd.scratchpad_desc(), OnednnEngine(), pad);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md}, {DNNL_ARG_SCRATCHPAD, mp}};
  if (m.bias) {
    CNNFLOW_ENFORCE(bias != nullptr, "OnednnConv::Forward: the layer has a bias");
    args.emplace(DNNL_ARG_BIAS, memory(m.user_bias, OnednnEngine(), const_cast<float*>(bias)));
  }
  m.fwd.execute(OnednnStream(), args);
  m.fwd_dst.Finish(dst, y, pad);
}

void OnednnConv::BackwardData(const float* dy, float* dx, const uint16_t* dy_bf16) const {
  OneOpenMpThreadHere();
  const Impl& m = *impl_;
  CNNFLOW_ENFORCE(dy_bf16 == nullptr || m.bf16, "OnednnConv: a bf16 dy for an f32 kernel");
  Impl::Scratch& s = m.Local();
  m.RunBackwardData(m.DiffDst(m.bd_diff_dst, m.bd_diff_dst16, {dy, dy_bf16}, s.a.raw_data(), s), dx,
                    s);
}

bool OnednnConv::HasFlippedData() const { return impl_->flipped_data; }

void OnednnConv::PrepareFlippedWeights(const float* w) {
  OneOpenMpThreadHere();
  Impl& m = *impl_;
  CNNFLOW_ENFORCE(m.flipped_data,
                  "OnednnConv: no flipped backward-data (bf16 or f32 "
                  "channels-last, ungrouped, stride 1 only)");
  const Conv2dGeometry& g = m.g;
  const int64_t kh = g.kernel_h, kw = g.kernel_w, taps = kh * kw;
  float* f = m.flip_wei_f32.data<float>();
  // The spatial flip here, in place of each (k, c) kernel; the swap of the
  // channel axes is the reorder's (from iohw).
  for (int64_t kc = 0; kc < g.out_channels * g.in_channels; ++kc) {
    const float* src = w + kc * taps;
    float* dst = f + kc * taps;
    for (int64_t t = 0; t < taps; ++t) dst[t] = src[taps - 1 - t];
  }
  if (m.f32_kernels) RoundToBf16(f, f, m.flip_wei_f32.numel());
  m.flip_wei_ptr = m.flip_wei.In(f, m.flip_wei_buf.raw_data(), m.Local().pad.data<float>());
}

void OnednnConv::BackwardDataByFlippedForward(const float* dy, float* dx,
                                              const uint16_t* dy_bf16) const {
  OneOpenMpThreadHere();
  const Impl& m = *impl_;
  CNNFLOW_ENFORCE(dy_bf16 == nullptr || m.bf16, "OnednnConv: a bf16 dy for an f32 kernel");
  Impl::Scratch& s = m.Local();
  m.RunFlipped(m.DiffDst(m.flip_src, m.flip_src16, {dy, dy_bf16}, s.a.raw_data(), s), dx, s);
}

bool OnednnConv::HasMatmulWeights() const { return impl_->matmul_weights; }

void OnednnConv::BackwardWeightsByMatmul(const float* x, const float* dy, float* dw, float* db,
                                         const uint16_t* kept_x, const uint16_t* dy_bf16) const {
  OneOpenMpThreadHere();
  const Impl& m = *impl_;
  CNNFLOW_ENFORCE(m.matmul_weights, "OnednnConv: no matmul backward-weights (bf16, ungrouped, ",
                  "avx512_bf16 only)");
  CNNFLOW_ENFORCE((kept_x == nullptr || m.nhwc_in) && (dy_bf16 == nullptr || m.nhwc_out),
                  "OnednnConv: the matmul backward-weights reads a converted x or dy only from "
                  "NHWC");
  Impl::Scratch& s = m.Local();
  const Conv2dGeometry& g = m.g;
  const int64_t plane = g.out_plane(), q = m.mb * plane, k_out = g.out_channels;
  const int64_t x_size = m.mb * g.in_channels * g.in_plane();
  auto* col = static_cast<uint16_t*>(Impl::Fit(s.col, 2 * g.col_rows() * q));
  auto* dyt = dy_bf16 != nullptr ? const_cast<uint16_t*>(dy_bf16)
                                 : static_cast<uint16_t*>(Impl::Fit(s.dyt, 2 * k_out * q));
  const uint16_t* xb = kept_x;
  if (xb == nullptr) {
    auto* buf = static_cast<uint16_t*>(Impl::Fit(s.xb, 2 * x_size));
    ToBf16(x, buf, x_size);
    xb = buf;
  }
  if (m.nhwc_in) {
    Im2ColNhwc(g, m.mb, xb, col);
  } else {
    Im2ColTransposed(g, m.mb, xb, col);
  }
  if (dy_bf16 == nullptr && m.nhwc_out) {
    ToBf16(dy, dyt, q * k_out);
  } else if (dy_bf16 == nullptr) {
    for (int64_t k = 0; k < k_out; ++k) {
      for (int64_t n = 0; n < m.mb; ++n)
        ToBf16(dy + (n * k_out + k) * plane, dyt + k * q + n * plane, plane);
    }
  }
  // From NHWC, dW comes out [K, kh, kw, C]: into [K, C, kh, kw] after.
  const int64_t taps = g.kernel_h * g.kernel_w, c_n = g.in_channels;
  float* out = m.nhwc_in ? static_cast<float*>(Impl::Fit(s.dwt, 4 * k_out * c_n * taps)) : dw;
  memory ms(m.mm_pd.src_desc(), OnednnEngine(), dyt);
  memory mw(m.mm_pd.weights_desc(), OnednnEngine(), col);
  memory md(m.mm_pd.dst_desc(), OnednnEngine(), out);
  memory mp(m.mm_pd.scratchpad_desc(), OnednnEngine(), s.pad.data<float>());
  m.mm.execute(
      OnednnStream(),
      {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md}, {DNNL_ARG_SCRATCHPAD, mp}});
  if (m.nhwc_in) {
    for (int64_t k = 0; k < k_out; ++k)
      for (int64_t t = 0; t < taps; ++t)
        for (int64_t c = 0; c < c_n; ++c)
          dw[(k * c_n + c) * taps + t] = out[(k * taps + t) * c_n + c];
  }
  if (m.bias) {
    CNNFLOW_ENFORCE(db != nullptr, "OnednnConv::BackwardWeightsByMatmul: the layer has a bias");
    if (m.nhwc_out) {
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

void OnednnConv::BackwardWeights(const float* x, const float* dy, float* dw, float* db,
                                 const uint16_t* x_bf16, const uint16_t* dy_bf16) const {
  OneOpenMpThreadHere();
  const Impl& m = *impl_;
  CNNFLOW_ENFORCE((x_bf16 == nullptr && dy_bf16 == nullptr) || m.bf16,
                  "OnednnConv: a bf16 x or dy for an f32 kernel");
  Impl::Scratch& s = m.Local();
  const void* src = m.WeightsPassSrc(x, x_bf16, s);
  m.RunBackwardWeights(
      src, m.DiffDst(m.bw_diff_dst, m.bw_diff_dst16, {dy, dy_bf16}, s.b.raw_data(), s), dw, db, s);
}

void OnednnConv::Backward(const float* x, const uint16_t* kept_x, const float* dy, float* dx,
                          ConvAlgo data, float* dw, float* db, ConvAlgo weights,
                          const uint16_t* dy_bf16) const {
  OneOpenMpThreadHere();
  const Impl& m = *impl_;
  const bool flipped = dx != nullptr && data == ConvAlgo::kFlipped;
  const bool primitive_weights = dw != nullptr && weights == ConvAlgo::kOnednn;
  const bool matmul_weights = dw != nullptr && weights == ConvAlgo::kMatmul;
  Impl::Scratch& s = m.Local();
  // Both passes read the same dy: convert it once.
  Impl::Dy d{dy, dy_bf16};
  if (m.dy_rounded_once) {
    const int64_t n = m.mb * m.g.out_channels * m.g.out_plane();
    auto* rounded = static_cast<float*>(Impl::Fit(s.dy_rounded, 4 * n));
    if (dy_bf16 != nullptr) {
      FromBf16(dy_bf16, rounded, n);
    } else {
      RoundToBf16(dy, rounded, n);
    }
    d = {rounded, nullptr, true};
  } else if (dy_bf16 == nullptr && m.f32_kernels) {
    d.bf16 = Impl::RoundedOperand(m.dst_to16, dy, s.dy16, s.pad.raw_data());
  } else if (dy_bf16 == nullptr && flipped && m.flip_src.ToBf16Nhwc() &&
             ((primitive_weights && m.bw_diff_dst.ToBf16Nhwc()) ||
              (matmul_weights && m.nhwc_out))) {
    auto* buf = static_cast<uint16_t*>(Impl::Fit(s.dy16, m.flip_src.to.get_size()));
    m.flip_src.Run(dy, buf, s.pad.raw_data());
    d.bf16 = buf;
  }
  if (primitive_weights) {
    m.RunBackwardWeights(m.WeightsPassSrc(x, kept_x, s),
                         m.DiffDst(m.bw_diff_dst, m.bw_diff_dst16, d, s.b.raw_data(), s), dw, db,
                         s);
  } else if (dw != nullptr) {
    CNNFLOW_ENFORCE(matmul_weights, "OnednnConv::Backward: backward-weights by ",
                    ConvAlgoName(weights));
    BackwardWeightsByMatmul(x, dy, dw, db, m.nhwc_in ? kept_x : nullptr,
                            m.nhwc_out ? d.bf16 : nullptr);
  }
  if (flipped) {
    m.RunFlipped(m.DiffDst(m.flip_src, m.flip_src16, d, s.a.raw_data(), s), dx, s);
  } else if (dx != nullptr) {
    CNNFLOW_ENFORCE(data == ConvAlgo::kOnednn, "OnednnConv::Backward: backward-data by ",
                    ConvAlgoName(data));
    m.RunBackwardData(m.DiffDst(m.bd_diff_dst, m.bd_diff_dst16, d, s.a.raw_data(), s), dx, s);
  }
}

}  // namespace cnnflow::cpu
