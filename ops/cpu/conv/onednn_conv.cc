// OnednnConv (onednn_conv.h): its passes (onednn_passes.h) built from one
// set of Options, each call's operands converted on the way in (bf16, the
// f32 kernels' rounding) and the per-thread buffers they go through.
#include "ops/cpu/conv/onednn_conv.h"

#include <tbb/enumerable_thread_specific.h>

#include <algorithm>
#include <dnnl.hpp>
#include <string>

#include "ops/cpu/bf16_layout.h"
#include "ops/cpu/conv/onednn_passes.h"
#include "ops/cpu/conv/onednn_reorder.h"
#include "ops/cpu/onednn.h"
#include "ops/error.h"
#include "ops/tensor.h"

namespace cnnflow::cpu {

using dnnl::memory;

struct OnednnConv::Impl {
  Conv2dGeometry g;
  int64_t mb = 0;
  Options o;
  UserLayouts user;
  ForwardPass forward;
  BackwardDataPass backward_data;
  FlippedDataPass flipped_data;  // where available
  BackwardWeightsPass backward_weights;
  MatmulWeightsPass matmul_weights;  // where available

  // f32 kernels: an f32 x or dy is first rounded to bf16 NHWC (x_to_bf16,
  // dy_to_bf16), and the weights to bf16 values in f32, so that the kernels
  // multiply the operands the bf16 kernels would.
  Reorder x_to_bf16, dy_to_bf16;
  // f32 kernels whose backward passes all read dy in its own layout
  // (channels-last x and y, on oneDNN's direct kernels): Backward rounds dy
  // to bf16 values in f32 once for both passes (8 bytes an element moved),
  // where each pass would widen a bf16 copy again (6 + 2 x 6).
  bool dy_rounded_once = false;

  ThreadBufferBytes buffer_bytes;  // the most any pass's call needs
  mutable tbb::enumerable_thread_specific<ThreadBuffers> buffers;

  // This thread's buffers, grown to buffer_bytes.
  ThreadBuffers& Local() const {
    ThreadBuffers& s = buffers.local();
    Fit(s.reordered_in, buffer_bytes.reordered_in);
    Fit(s.reordered_out, buffer_bytes.reordered_out);
    Fit(s.reordered_dw, buffer_bytes.reordered_dw);
    Fit(s.scratchpad, buffer_bytes.scratchpad);
    return s;
  }
  // f32 kernels: p (laid out as r.from) rounded to bf16 NHWC in buf.
  static const uint16_t* RoundedOperand(const Reorder& r, const float* p, Tensor& buf,
                                        void* scratchpad) {
    auto* out = static_cast<uint16_t*>(Fit(buf, r.to.get_size()));
    r.Run(p, out, scratchpad);
    return out;
  }
  // w [K, C/groups, kh, kw] into a pass's layout (f32 kernels: rounded to
  // bf16 values first, in this thread's buffer, or in weights.rounded where
  // no reorder copies them).
  void PrepareWeights(PreparedWeights& weights, const float* w) {
    const float* ready = w;
    if (o.f32_kernels) {
      const int64_t n = g.out_channels * g.in_per_group() * g.kernel_h * g.kernel_w;
      Tensor& out = weights.reorder.needed() ? Local().weights_rounded : weights.rounded;
      if (!out.defined() || out.numel() < n) out = Tensor::Empty({n});
      RoundToBf16(w, out.data<float>(), n);
      ready = out.data<float>();
    }
    weights.ptr =
        weights.reorder.In(ready, weights.buf.raw_data(), Local().scratchpad.data<float>());
  }
  // Whether the forward reads every x as bf16 NHWC (the f32 kernels: rounded
  // so; the bf16 ones: converted so by our own reorder).
  bool ForwardReadsBf16Nhwc() const { return o.f32_kernels || forward.x_in.ToBf16Nhwc(); }

  // dy as a backward pass is given it: in bf16 NHWC (bf16), else in f32,
  // where `rounded` says it holds bf16 values already (dy_rounded_once).
  struct Dy {
    const float* f32 = nullptr;
    const uint16_t* bf16 = nullptr;
    bool rounded = false;
  };
  // A backward pass's dy in its primitive's layout (in buf where a reorder
  // writes it): dy.bf16 by dy16_in, else dy.f32 by dy_in (f32 kernels,
  // unless rounded: rounded to bf16 NHWC first, then by dy16_in).
  const void* DiffDst(const Reorder& dy_in, const Reorder& dy16_in, Dy dy, void* buf,
                      ThreadBuffers& s) const {
    void* scratchpad = s.scratchpad.raw_data();
    if (o.f32_kernels && !dy.rounded && dy.bf16 == nullptr)
      dy.bf16 = RoundedOperand(dy_to_bf16, dy.f32, s.dy16, scratchpad);
    return dy.bf16 != nullptr ? dy16_in.In(dy.bf16, buf, scratchpad)
                              : dy_in.In(dy.f32, buf, scratchpad);
  }
  // The backward-weights' x in its primitive's layout (in s.reordered_in
  // where a reorder writes it), as DiffDst.
  const void* WeightsPassSrc(const float* x, const uint16_t* x_bf16, ThreadBuffers& s) const {
    void* scratchpad = s.scratchpad.raw_data();
    if (o.f32_kernels && x_bf16 == nullptr)
      x_bf16 = RoundedOperand(x_to_bf16, x, s.x16, scratchpad);
    return x_bf16 != nullptr
               ? backward_weights.x16_in.In(x_bf16, s.reordered_in.raw_data(), scratchpad)
               : backward_weights.x_in.In(x, s.reordered_in.raw_data(), scratchpad);
  }
  // The backward passes, dy given as d, x (or x_bf16: bf16 NHWC) into
  // dw, db; dy into dx.
  void RunBackwardWeights(const float* x, const uint16_t* x_bf16, Dy d, float* dw, float* db,
                          ThreadBuffers& s) const {
    const void* src = WeightsPassSrc(x, x_bf16, s);
    backward_weights.Run(
        src,
        DiffDst(backward_weights.dy_in, backward_weights.dy16_in, d, s.reordered_out.raw_data(), s),
        dw, db, user, o.bias, s);
  }
  void RunBackwardData(Dy d, float* dx, ThreadBuffers& s) const {
    backward_data.Run(
        DiffDst(backward_data.dy_in, backward_data.dy16_in, d, s.reordered_in.raw_data(), s), dx,
        s);
  }
  void RunFlipped(Dy d, float* dx, ThreadBuffers& s) const {
    flipped_data.Run(
        DiffDst(flipped_data.dy_in, flipped_data.dy16_in, d, s.reordered_in.raw_data(), s), dx, s);
  }

  // The most each of a thread's buffers must hold for any pass's call.
  ThreadBufferBytes BufferNeeds() const;
};

ThreadBufferBytes OnednnConv::Impl::BufferNeeds() const {
  const ForwardPass& f = forward;
  const BackwardDataPass& bd = backward_data;
  const BackwardWeightsPass& bw = backward_weights;
  ThreadBufferBytes b;
  b.reordered_in = std::max(
      {BufferBytes(f.x_in, f.pd.src_desc()), BufferBytes(bd.dy_in, bd.pd.diff_dst_desc()),
       BufferBytes(bw.x_in, bw.pd.src_desc()), BufferBytes(f.x16_in, f.pd.src_desc()),
       BufferBytes(bw.x16_in, bw.pd.src_desc()), BufferBytes(bd.dy16_in, bd.pd.diff_dst_desc())});
  b.reordered_out = std::max({BufferBytes(f.y_out, f.pd.dst_desc()),
                              BufferBytes(bd.dx_out, bd.pd.diff_src_desc()),
                              BufferBytes(bw.dy_in, bw.pd.diff_dst_desc()),
                              BufferBytes(bw.dy16_in, bw.pd.diff_dst_desc())});
  b.reordered_dw = BufferBytes(bw.dw_out, bw.pd.diff_weights_desc());
  b.scratchpad = std::max(
      {f.pd.scratchpad_desc().get_size(), bd.pd.scratchpad_desc().get_size(),
       bw.pd.scratchpad_desc().get_size(), f.x_in.scratchpad_bytes(), f.y_out.scratchpad_bytes(),
       bd.dy_in.scratchpad_bytes(), bd.dx_out.scratchpad_bytes(), bw.x_in.scratchpad_bytes(),
       bw.dy_in.scratchpad_bytes(), bw.dw_out.scratchpad_bytes(),
       f.weights.reorder.scratchpad_bytes(), bd.weights.reorder.scratchpad_bytes(),
       f.x16_in.scratchpad_bytes(), bw.x16_in.scratchpad_bytes(), bd.dy16_in.scratchpad_bytes(),
       bw.dy16_in.scratchpad_bytes(), x_to_bf16.scratchpad_bytes(), dy_to_bf16.scratchpad_bytes()});
  if (flipped_data.available) {
    const FlippedDataPass& fl = flipped_data;
    b.reordered_in = std::max({b.reordered_in, BufferBytes(fl.dy_in, fl.pd.src_desc()),
                               BufferBytes(fl.dy16_in, fl.pd.src_desc())});
    b.reordered_out = std::max(b.reordered_out, BufferBytes(fl.dx_out, fl.pd.dst_desc()));
    b.scratchpad = std::max({b.scratchpad, fl.pd.scratchpad_desc().get_size(),
                             fl.dy_in.scratchpad_bytes(), fl.dx_out.scratchpad_bytes(),
                             fl.weights.reorder.scratchpad_bytes(), fl.dy16_in.scratchpad_bytes()});
  }
  if (matmul_weights.available) {
    b.scratchpad = std::max(b.scratchpad, matmul_weights.pd.scratchpad_desc().get_size());
  }
  return b;
}

OnednnConv::OnednnConv(const Conv2dGeometry& g, int64_t mb, const Options& o)
    : mb_(mb), impl_(std::make_unique<Impl>()) {
  // oneDNN sizes a primitive's OpenMP team when it creates the primitive,
  // from this thread's max threads: pinned after creation, a primitive made
  // here would still run on a team of every core, beside TBB's threads.
  OneOpenMpThreadHere();
  Impl& m = *impl_;
  m.g = g;
  m.mb = mb;
  m.o = o;
  const ConvDims d(g, mb);
  m.user = UserLayouts(d, o.nhwc_in, o.nhwc_out);
  CNNFLOW_ENFORCE(o.bf16 || !o.f32_kernels, "OnednnConv: f32 kernels for bf16 operands only");
  // The operands of the products (x, w, dy) in the kernels' type; the
  // results (y, dx, dw) in f32.
  const bool bf16_kernels = o.bf16 && !o.f32_kernels;
  const memory::data_type op = bf16_kernels ? memory::data_type::bf16 : memory::data_type::f32;
  // f32 channels-last tensors are read and written as they are where
  // oneDNN has kernels for that (its brgemm forward and jit backward ones on
  // AVX-512, when x and y are both channels-last), saving each pass a
  // reorder to its blocked layout and back
  // (bench/results/2026-12-07-conv-notes.md). Elsewhere (its reference kernels
  // would be picked) and for bf16 kernels, whose operands are converted on
  // the way in anyway, oneDNN picks the layouts (format_tag::any).
  const bool direct = !bf16_kernels && o.nhwc_in && o.nhwc_out;
  // Every primitive and reorder takes its scratchpad from the caller: one
  // buffer per thread (ThreadBuffers).
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  try {
    BuildConvolutionPasses(d, m.user, o, op, direct, attr, m.forward, m.backward_data,
                           m.backward_weights);
    if (o.f32_kernels) {
      m.x_to_bf16 = Reorder(m.user.x, m.user.x_bf16, attr);
      m.dy_to_bf16 = Reorder(m.user.y, m.user.dy_bf16, attr);
    }
  } catch (const dnnl::error& e) {
    throw Error(StrCat("oneDNN has no ", bf16_kernels ? "bf16 " : "", "convolution for input [", mb,
                       ", ", g.in_channels, ", ", g.in_h, ", ", g.in_w, "], kernel ", g.kernel_h,
                       "x", g.kernel_w, " stride ", g.stride_h, "x", g.stride_w, " groups ",
                       g.groups, ": ", e.what()));
  }
  m.flipped_data.Build(g, d, m.user, op, bf16_kernels, direct, o.bf16, attr);
  if (bf16_kernels && !d.grouped && CpuHasAvx512Bf16()) {
    m.matmul_weights.Build(g, mb, o.nhwc_in, o.nhwc_out, attr);
  }
  m.dy_rounded_once = o.f32_kernels && !m.backward_data.dy_in.needed() &&
                      !m.backward_weights.dy_in.needed() &&
                      (!m.flipped_data.available || !m.flipped_data.dy_in.needed());
  m.buffer_bytes = m.BufferNeeds();
}

OnednnConv::~OnednnConv() = default;

std::string OnednnConv::ImplInfo() const {
  return StrCat("forward ", impl_->forward.pd.impl_info_str(), ", backward-data ",
                impl_->backward_data.pd.impl_info_str(), ", backward-weights ",
                impl_->backward_weights.pd.impl_info_str());
}

void OnednnConv::PrepareForwardWeights(const float* w) {
  OneOpenMpThreadHere();
  impl_->PrepareWeights(impl_->forward.weights, w);
}

void OnednnConv::PrepareBackwardWeights(const float* w) {
  OneOpenMpThreadHere();
  impl_->PrepareWeights(impl_->backward_data.weights, w);
}

bool OnednnConv::KeepsInput(ConvAlgo weights) const {
  const Impl& m = *impl_;
  return m.ForwardReadsBf16Nhwc() &&
         (weights == ConvAlgo::kMatmul ? m.o.nhwc_in && m.matmul_weights.available
                                       : m.o.f32_kernels || m.backward_weights.x_in.ToBf16Nhwc());
}

void OnednnConv::Forward(const float* x, const float* bias, float* y, uint16_t* keep_x,
                         const uint16_t* x_bf16) const {
  OneOpenMpThreadHere();
  const Impl& m = *impl_;
  CNNFLOW_ENFORCE(m.forward.weights.ptr != nullptr,
                  "OnednnConv::Forward before PrepareForwardWeights");
  CNNFLOW_ENFORCE(keep_x == nullptr || (m.ForwardReadsBf16Nhwc() && x_bf16 == nullptr),
                  "OnednnConv::Forward: keep_x where the input is not converted to bf16 NHWC");
  CNNFLOW_ENFORCE(x_bf16 == nullptr || m.o.bf16, "OnednnConv::Forward: a bf16 x for an f32 kernel");
  ThreadBuffers& s = m.Local();
  void* scratchpad = s.scratchpad.data<float>();
  if (m.o.f32_kernels && x_bf16 == nullptr && keep_x != nullptr) {
    m.x_to_bf16.Run(x, keep_x, scratchpad);
    x_bf16 = keep_x;
  } else if (m.o.f32_kernels && x_bf16 == nullptr) {
    x_bf16 = Impl::RoundedOperand(m.x_to_bf16, x, s.x16, scratchpad);
  }
  const void* src =
      x_bf16 != nullptr
          ? m.forward.x16_in.In(x_bf16, s.reordered_in.raw_data(), scratchpad)
          : m.forward.x_in.In(x, keep_x != nullptr ? keep_x : s.reordered_in.raw_data(),
                              scratchpad);
  m.forward.Run(src, bias, y, m.user, m.o.bias, s);
}

void OnednnConv::BackwardData(const float* dy, float* dx, const uint16_t* dy_bf16) const {
  OneOpenMpThreadHere();
  const Impl& m = *impl_;
  CNNFLOW_ENFORCE(dy_bf16 == nullptr || m.o.bf16, "OnednnConv: a bf16 dy for an f32 kernel");
  m.RunBackwardData({dy, dy_bf16}, dx, m.Local());
}

bool OnednnConv::HasFlippedData() const { return impl_->flipped_data.available; }

void OnednnConv::PrepareFlippedWeights(const float* w) {
  OneOpenMpThreadHere();
  Impl& m = *impl_;
  CNNFLOW_ENFORCE(m.flipped_data.available,
                  "OnednnConv: no flipped backward-data (bf16 or f32 "
                  "channels-last, ungrouped, stride 1 only)");
  m.flipped_data.Prepare(m.g, w, m.o.f32_kernels, m.Local().scratchpad.data<float>());
}

void OnednnConv::BackwardDataByFlippedForward(const float* dy, float* dx,
                                              const uint16_t* dy_bf16) const {
  OneOpenMpThreadHere();
  const Impl& m = *impl_;
  CNNFLOW_ENFORCE(dy_bf16 == nullptr || m.o.bf16, "OnednnConv: a bf16 dy for an f32 kernel");
  m.RunFlipped({dy, dy_bf16}, dx, m.Local());
}

bool OnednnConv::HasMatmulWeights() const { return impl_->matmul_weights.available; }

void OnednnConv::BackwardWeightsByMatmul(const float* x, const float* dy, float* dw, float* db,
                                         const uint16_t* kept_x, const uint16_t* dy_bf16) const {
  OneOpenMpThreadHere();
  const Impl& m = *impl_;
  CNNFLOW_ENFORCE(m.matmul_weights.available,
                  "OnednnConv: no matmul backward-weights (bf16, ungrouped, ", "avx512_bf16 only)");
  CNNFLOW_ENFORCE((kept_x == nullptr || m.o.nhwc_in) && (dy_bf16 == nullptr || m.o.nhwc_out),
                  "OnednnConv: the matmul backward-weights reads a converted x or dy only from "
                  "NHWC");
  m.matmul_weights.Run(m.g, m.mb, m.o, x, dy, dw, db, kept_x, dy_bf16, m.Local());
}

void OnednnConv::BackwardWeights(const float* x, const float* dy, float* dw, float* db,
                                 const uint16_t* x_bf16, const uint16_t* dy_bf16) const {
  OneOpenMpThreadHere();
  const Impl& m = *impl_;
  CNNFLOW_ENFORCE((x_bf16 == nullptr && dy_bf16 == nullptr) || m.o.bf16,
                  "OnednnConv: a bf16 x or dy for an f32 kernel");
  m.RunBackwardWeights(x, x_bf16, {dy, dy_bf16}, dw, db, m.Local());
}

void OnednnConv::Backward(const float* x, const uint16_t* kept_x, const float* dy, float* dx,
                          ConvAlgo data, float* dw, float* db, ConvAlgo weights,
                          const uint16_t* dy_bf16) const {
  OneOpenMpThreadHere();
  const Impl& m = *impl_;
  const bool flipped = dx != nullptr && data == ConvAlgo::kFlipped;
  const bool primitive_weights = dw != nullptr && weights == ConvAlgo::kOnednn;
  const bool matmul_weights = dw != nullptr && weights == ConvAlgo::kMatmul;
  ThreadBuffers& s = m.Local();
  // Both passes read the same dy: convert it once.
  Impl::Dy d{dy, dy_bf16};
  if (m.dy_rounded_once) {
    const int64_t n = m.mb * m.g.out_channels * m.g.out_plane();
    auto* rounded = static_cast<float*>(Fit(s.dy_rounded, 4 * n));
    if (dy_bf16 != nullptr) {
      FromBf16(dy_bf16, rounded, n);
    } else {
      RoundToBf16(dy, rounded, n);
    }
    d = {rounded, nullptr, true};
  } else if (dy_bf16 == nullptr && m.o.f32_kernels) {
    d.bf16 = Impl::RoundedOperand(m.dy_to_bf16, dy, s.dy16, s.scratchpad.raw_data());
  } else if (dy_bf16 == nullptr && flipped && m.flipped_data.dy_in.ToBf16Nhwc() &&
             ((primitive_weights && m.backward_weights.dy_in.ToBf16Nhwc()) ||
              (matmul_weights && m.o.nhwc_out))) {
    auto* buf = static_cast<uint16_t*>(Fit(s.dy16, m.flipped_data.dy_in.to.get_size()));
    m.flipped_data.dy_in.Run(dy, buf, s.scratchpad.raw_data());
    d.bf16 = buf;
  }
  if (primitive_weights) {
    m.RunBackwardWeights(x, kept_x, d, dw, db, s);
  } else if (dw != nullptr) {
    CNNFLOW_ENFORCE(matmul_weights, "OnednnConv::Backward: backward-weights by ",
                    ConvAlgoName(weights));
    BackwardWeightsByMatmul(x, dy, dw, db, m.o.nhwc_in ? kept_x : nullptr,
                            m.o.nhwc_out ? d.bf16 : nullptr);
  }
  if (flipped) {
    m.RunFlipped(d, dx, s);
  } else if (dx != nullptr) {
    CNNFLOW_ENFORCE(data == ConvAlgo::kOnednn, "OnednnConv::Backward: backward-data by ",
                    ConvAlgoName(data));
    m.RunBackwardData(d, dx, s);
  }
}

}  // namespace cnnflow::cpu
