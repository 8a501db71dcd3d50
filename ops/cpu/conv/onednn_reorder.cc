// Reorder (onednn_reorder.h): oneDNN's reorder primitive or our own.
#include "ops/cpu/conv/onednn_reorder.h"

#include "ops/cpu/bf16_layout.h"
#include "ops/cpu/onednn.h"

namespace cnnflow::cpu {

using dnnl::memory;
using Tag = memory::format_tag;

Reorder::Reorder(const memory::desc& from, const memory::desc& to, const dnnl::primitive_attr& attr)
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
      plane = d[2] * d[3];
      return;
    }
  }
  kind = Kind::kOnednn;
  pd = dnnl::reorder::primitive_desc(OnednnEngine(), from, OnednnEngine(), to, attr);
  primitive = dnnl::reorder(pd);
}

void Reorder::Run(const void* src, void* dst, void* scratchpad) const {
  if (kind == Kind::kNchwToNhwcBf16) {
    NchwToNhwcBf16(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n, c, plane);
    return;
  }
  if (kind == Kind::kNhwcToBf16) {
    ToBf16(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n * c * plane);
    return;
  }
  if (kind == Kind::kNhwcToNchw) {
    NhwcToNchw(static_cast<const float*>(src), static_cast<float*>(dst), n, c, plane);
    return;
  }
  if (kind == Kind::kBf16ToNhwc) {
    FromBf16(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n * c * plane);
    return;
  }
  memory s(from, OnednnEngine(), const_cast<void*>(src)), d(to, OnednnEngine(), dst);
  memory p(pd.scratchpad_desc(), OnednnEngine(), scratchpad);
  primitive.execute(OnednnStream(),
                    {{DNNL_ARG_FROM, s}, {DNNL_ARG_TO, d}, {DNNL_ARG_SCRATCHPAD, p}});
}

}  // namespace cnnflow::cpu
