// Conv2dScratch (scratch.h): what Build precomputes from the geometry.
#include "ops/cpu/conv/scratch.h"

#include "ops/cpu/conv/lowering.h"

namespace cnnflow {

Conv2dScratch::Conv2dScratch(const Conv2dGeometry& g) : shiftable(cpu::IsShiftable(g)) {
  if (!shiftable) return;
  border_begin.push_back(0);
  for (int64_t i = 0; i < g.kernel_h; ++i) {
    const int64_t ih0 = i * g.dilation_h - g.pad_h;
    const int64_t oh_lo = std::clamp<int64_t>(-ih0, 0, g.out_h);
    const int64_t oh_hi = std::clamp<int64_t>(g.in_h - ih0, oh_lo, g.out_h);
    for (int64_t j = 0; j < g.kernel_w; ++j) {
      const int64_t iw0 = j * g.dilation_w - g.pad_w;
      TapSpan t;
      t.shift = ih0 * g.in_w + iw0;
      t.p0 = std::max(oh_lo * g.out_w, -t.shift);
      t.p1 = std::max(t.p0, std::min(oh_hi * g.out_w, g.in_plane() - t.shift));
      for (int64_t p = t.p0; p < t.p1; ++p) {
        const int64_t iw = p % g.out_w + iw0;
        if (iw < 0 || iw >= g.in_w) border.push_back(static_cast<int32_t>(p));
      }
      border_begin.push_back(border.size());
      if (t.shift == 0 && t.p0 == 0 && t.p1 == g.out_plane() && g.out_h == g.in_h) {
        centre = static_cast<int64_t>(taps.size());
      }
      taps.push_back(t);
    }
  }
}

}  // namespace cnnflow
