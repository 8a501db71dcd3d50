// A reorder between two layouts of one tensor for OnednnConv's passes:
// oneDNN's reorder primitive, or our own conversions for the ones that bf16
// convolutions run on every activation (f32 NCHW or NHWC to bf16 NHWC, f32
// NHWC to NCHW, bf16 NHWC to f32 NHWC: ops/cpu/bf16_layout.h), or nothing
// where the two layouts are the same. Internal to ops/cpu/conv/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <dnnl.hpp>

namespace cnnflow::cpu {

struct Reorder {
  enum class Kind { kNone, kOnednn, kNchwToNhwcBf16, kNhwcToBf16, kNhwcToNchw, kBf16ToNhwc };
  Reorder() = default;
  // From `from` to `to`; attr: the primitive's attributes (a user scratchpad).
  Reorder(const dnnl::memory::desc& from, const dnnl::memory::desc& to,
          const dnnl::primitive_attr& attr);

  bool needed() const { return kind != Kind::kNone; }
  // Whether it writes bf16 NHWC by our own conversion (from NCHW or NHWC).
  bool ToBf16Nhwc() const { return kind == Kind::kNchwToNhwcBf16 || kind == Kind::kNhwcToBf16; }
  // The bytes of scratchpad its primitive needs (0: ours, or none).
  size_t scratchpad_bytes() const { return primitive ? pd.scratchpad_desc().get_size() : 0; }
  // An input `p` laid out as `from`: what the primitive reads (p itself, or
  // buf after the reorder).
  const void* In(const void* p, void* buf, void* scratchpad) const {
    if (!needed()) return p;
    Run(p, buf, scratchpad);
    return buf;
  }
  // Where the primitive writes an output bound for `p`: p itself, or buf,
  // which Finish then reorders into p.
  void* Out(void* p, void* buf) const { return needed() ? buf : p; }
  void Finish(const void* buf, void* p, void* scratchpad) const {
    if (needed()) Run(buf, p, scratchpad);
  }
  // Runs it from `src` into `dst`: pointers laid out as `from` and `to`.
  void Run(const void* src, void* dst, void* scratchpad) const;

  dnnl::memory::desc from, to;
  Kind kind = Kind::kNone;
  int64_t n = 0, c = 0, plane = 0;  // our own kinds: [n, c, H * W] in NCHW terms
  dnnl::reorder::primitive_desc pd;
  dnnl::reorder primitive;
};

}  // namespace cnnflow::cpu
