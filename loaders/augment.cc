#include "loaders/augment.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <string>
#include <utility>
#include <vector>

#include "ops/cpu/isa.h"
#include "ops/error.h"
#include "ops/random.h"

namespace cnnflow {

ImageSize ResizedSize(int h, int w, int resize_min_side) {
  if (resize_min_side <= 0 || h <= 0 || w <= 0) return {h, w};
  if (h <= w) return {resize_min_side, static_cast<int>(int64_t{w} * resize_min_side / h)};
  return {static_cast<int>(int64_t{h} * resize_min_side / w), resize_min_side};
}

namespace {

// Offset of an `out`-long window in `size` (padded) pixels.
int CropOffset(int size, int out, bool random, uint64_t key, uint64_t counter) {
  const int range = size - out;
  // Window larger than the image: centred, the extra zeros split as
  // torchvision's CenterCrop pads (the odd one at the end).
  if (range < 0) return -((-range) / 2);
  // Python's round() is round-half-even, as nearbyint in the default mode.
  if (!random) return static_cast<int>(std::nearbyint(range / 2.0));
  return std::min(range, static_cast<int>(UniformAt(key, counter) * (range + 1)));
}

// pshufb masks that split 16 interleaved kC-channel pixels (kC 16-byte
// registers) into one 16-byte register per channel, in pixel order or
// reversed (flip): masks[flip][ch][reg], 0x80 where a lane comes from
// another register.
template <int kC>
struct DeinterleaveMasks {
  alignas(16) uint8_t m[2][kC][kC][16];
  DeinterleaveMasks() {
    for (int flip = 0; flip < 2; ++flip) {
      for (int ch = 0; ch < kC; ++ch) {
        for (int reg = 0; reg < kC; ++reg) {
          for (int j = 0; j < 16; ++j) {
            const int k = kC * (flip ? 15 - j : j) + ch;  // source byte of output pixel j
            m[flip][ch][reg][j] = k / 16 == reg ? static_cast<uint8_t>(k % 16) : 0x80;
          }
        }
      }
    }
  }
};

// Output pixels [0, n) of one row, 16 at a time, from px (flip: px is the
// source of output 0 and the row runs backwards): o[ch][x] = (v / 255 -
// mean[ch]) / std[ch] with the same float operations as the table, so the
// result is bitwise the table's. Returns how many pixels it wrote (a
// multiple of 16); the caller finishes the row.
template <int kC>
__attribute__((target("avx2"))) int GatherRunAvx2(const uint8_t* px, int n, bool flip,
                                                  float* const* o, const float* mean,
                                                  const float* std) {
  static const DeinterleaveMasks<kC> masks;
  const __m256 k255 = _mm256_set1_ps(255.f);
  int x = 0;
  for (; x + 16 <= n; x += 16) {
    // The 16 source pixels: [px + x C, ... + 16 C), or for flip the 16
    // ending at px - x C (inclusive).
    const uint8_t* base = flip ? px - (x + 15) * kC : px + x * kC;
    __m128i reg[kC];
    for (int r = 0; r < kC; ++r) {
      reg[r] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + 16 * r));
    }
    for (int ch = 0; ch < kC; ++ch) {
      __m128i v = _mm_setzero_si128();
      for (int r = 0; r < kC; ++r) {
        const __m128i m = _mm_load_si128(reinterpret_cast<const __m128i*>(masks.m[flip][ch][r]));
        v = _mm_or_si128(v, _mm_shuffle_epi8(reg[r], m));
      }
      const __m256 mu = _mm256_set1_ps(mean[ch]), sd = _mm256_set1_ps(std[ch]);
      for (int half = 0; half < 2; ++half) {
        const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(half ? _mm_srli_si128(v, 8) : v));
        _mm256_storeu_ps(o[ch] + x + 8 * half,
                         _mm256_div_ps(_mm256_sub_ps(_mm256_div_ps(f, k255), mu), sd));
      }
    }
  }
  return x;
}

// The source index of a padded position: ops/crop_flip.h's rule, which the
// device-resident set's GPU kernel shares.
int SourceIndex(int i, int n, int pad, bool reflect) {
  return PadSourceIndex(i, n, pad, reflect ? 1 : 0);
}

// Channel ch's value of a normalisation list: none (`none`), one for every
// channel, or one per channel.
float ChannelValue(const std::vector<float>& list, size_t ch, float none) {
  return list.empty() ? none : list[list.size() == 1 ? 0 : ch];
}

// One pass: crop (with implicit zero or reflect padding) + flip + normalise
// (table) + HWC -> CHW. kC > 0 fixes the channel count at compile time so
// the channel loop unrolls; kC == 0 reads it from c. The columns that read
// the image row itself go through the vector path; with reflect padding the
// few mirrored border columns are read one by one.
template <int kC>
void Gather(const uint8_t* src, int h, int w, int c, int pad, bool reflect, const AugmentParams& p,
            int out_h, int out_w, const float* lut, int lut_stride, const float* mean,
            const float* std, float* out) {
  [[maybe_unused]] const bool avx2 = cpu::MaxIsa() >= cpu::Isa::kAvx2;
  const int C = kC > 0 ? kC : c;
  const int64_t plane = int64_t{out_h} * out_w;
  // Output columns [x0, x1) read the image; the rest are padding. Source
  // column of output x: first + x (or first - x when flipped).
  const int first = p.flip ? p.left + out_w - 1 - pad : p.left - pad;
  int x0, x1;
  if (!p.flip) {
    x0 = std::clamp(-first, 0, out_w);
    x1 = std::clamp(w - first, x0, out_w);
  } else {
    x0 = std::clamp(first - w + 1, 0, out_w);
    x1 = std::clamp(first + 1, x0, out_w);
  }
  const int64_t step = p.flip ? -C : C;
  float* o[4];
  const float* l[4];
  for (int ch = 0; ch < C; ++ch) l[ch] = lut + ch * lut_stride;
  // Reflect-padding columns [from, to) of a source row, one by one.
  auto mirrored = [&](const uint8_t* row, int from, int to) {
    for (int x = from; x < to; ++x) {
      const int sx = SourceIndex(p.flip ? first - x : first + x, w, pad, true);
      for (int ch = 0; ch < C; ++ch) o[ch][x] = sx < 0 ? l[ch][0] : l[ch][row[sx * C + ch]];
    }
  };
  for (int y = 0; y < out_h; ++y) {
    const int sy = SourceIndex(p.top + y - pad, h, pad, reflect);
    for (int ch = 0; ch < C; ++ch) o[ch] = out + ch * plane + int64_t{y} * out_w;
    if (sy < 0) {
      for (int ch = 0; ch < C; ++ch) std::fill(o[ch], o[ch] + out_w, l[ch][0]);
      continue;
    }
    const uint8_t* row = src + int64_t{sy} * w * C;
    if (reflect) {
      mirrored(row, 0, x0);
      mirrored(row, x1, out_w);
    } else {
      for (int ch = 0; ch < C; ++ch) {
        std::fill(o[ch], o[ch] + x0, l[ch][0]);
        std::fill(o[ch] + x1, o[ch] + out_w, l[ch][0]);
      }
    }
    if (x0 == x1) continue;
    const int sx0 = p.flip ? first - x0 : first + x0;
    const uint8_t* px = row + int64_t{sx0} * C;
    int x = x0;
    if constexpr (kC == 1 || kC == 3) {
      if (avx2) {
        float* run[kC];
        for (int ch = 0; ch < kC; ++ch) run[ch] = o[ch] + x0;
        const int done = GatherRunAvx2<kC>(px, x1 - x0, p.flip, run, mean, std);
        x += done;
        px += step * done;
      }
    }
    for (; x < x1; ++x, px += step) {
      for (int ch = 0; ch < C; ++ch) o[ch][x] = l[ch][px[ch]];
    }
  }
}

// The crop (with zero or reflect padding) and flip of Gather, kept as
// uint8: dst is [out_h, out_w, c].
void CropU8(const uint8_t* src, int h, int w, int c, int pad, bool reflect, const AugmentParams& p,
            int out_h, int out_w, uint8_t* dst) {
  const int first = p.flip ? p.left + out_w - 1 - pad : p.left - pad;
  std::vector<int> sxs(out_w);  // each output column's source column, or -1
  for (int x = 0; x < out_w; ++x) {
    sxs[x] = SourceIndex(p.flip ? first - x : first + x, w, pad, reflect);
  }
  for (int y = 0; y < out_h; ++y) {
    const int sy = SourceIndex(p.top + y - pad, h, pad, reflect);
    uint8_t* out = dst + int64_t{y} * out_w * c;
    if (sy < 0) {
      std::fill(out, out + int64_t{out_w} * c, uint8_t{0});
      continue;
    }
    const uint8_t* row = src + int64_t{sy} * w * c;
    for (int x = 0; x < out_w; ++x, out += c) {
      if (sxs[x] < 0) {
        std::fill(out, out + c, uint8_t{0});
      } else {
        std::copy_n(row + int64_t{sxs[x]} * c, c, out);
      }
    }
  }
}

// The region roi of an h x w x c image resized to `to` (cv::resize,
// INTER_LINEAR) into dst.
void Resize(const uint8_t* src, int h, int w, int c, const cv::Rect& roi, ImageSize to,
            uint8_t* dst) {
  const cv::Mat in(h, w, CV_8UC(c), const_cast<uint8_t*>(src));
  cv::Mat out(to.h, to.w, CV_8UC(c), dst);
  cv::resize(in(roi), out, cv::Size(to.w, to.h), 0, 0, cv::INTER_LINEAR);
  CNNFLOW_ENFORCE(out.data == dst, "cv::resize reallocated its output");
}

// One try of torchvision's rectangle draw (RandomErasing.get_params,
// RandomResizedCrop.get_params): a ~ U(scale) * area, log r ~ U(log ratio);
// returns {sqrt(a r), sqrt(a / r)} rounded half to even, as Python's round().
std::pair<int, int> DrawSides(double area, const std::array<double, 2>& scale,
                              const std::array<double, 2>& ratio, uint64_t key, uint64_t counter) {
  const double a = area * (scale[0] + (scale[1] - scale[0]) * UniformAt(key, counter));
  const double log_lo = std::log(ratio[0]), log_hi = std::log(ratio[1]);
  const double r = std::exp(log_lo + (log_hi - log_lo) * UniformAt(key, counter + 1));
  return {static_cast<int>(std::nearbyint(std::sqrt(a * r))),
          static_cast<int>(std::nearbyint(std::sqrt(a / r)))};
}

// Uniform in [0, n], as torch.randint(0, n + 1).
int UniformUpTo(int n, uint64_t key, uint64_t counter) {
  return std::min(n, static_cast<int>(UniformAt(key, counter) * (n + 1)));
}

// RandomErasing on the [out_h, out_w] output: up to 10 tries (h, w) =
// DrawSides (ratio h / w); the first strictly inside is placed uniformly;
// none: nothing is erased.
void DrawErase(const AugmentOptions& o, uint64_t key, AugmentParams* p) {
  const double area = static_cast<double>(o.out_h) * o.out_w;
  for (uint64_t k = 0; k < 10; ++k) {
    const uint64_t c = 4 + 4 * k;
    const auto [h, w] = DrawSides(area, o.erase_scale, o.erase_ratio, key, c);
    if (!(h < o.out_h && w < o.out_w)) continue;
    p->erase_h = h;
    p->erase_w = w;
    p->erase_top = UniformUpTo(o.out_h - h, key, c + 2);
    p->erase_left = UniformUpTo(o.out_w - w, key, c + 3);
    return;
  }
}

// RandomResizedCrop on an h x w image: up to 10 tries (w, h) = DrawSides
// (ratio w / h); the first with 0 < h <= image h and 0 < w <= image w is
// placed uniformly; none: the whole image, cut to the ratio's range,
// centred (floor division, as torchvision).
void DrawResizedCrop(int h, int w, const AugmentOptions& o, uint64_t key, AugmentParams* p) {
  const double area = static_cast<double>(h) * w;
  for (uint64_t k = 0; k < 10; ++k) {
    const uint64_t c = 100 + 4 * k;
    const auto [cw, ch] = DrawSides(area, o.crop_scale, o.crop_ratio, key, c);
    if (!(cw > 0 && cw <= w && ch > 0 && ch <= h)) continue;
    p->crop_h = ch;
    p->crop_w = cw;
    p->top = UniformUpTo(h - ch, key, c + 2);
    p->left = UniformUpTo(w - cw, key, c + 3);
    return;
  }
  const double in_ratio = static_cast<double>(w) / h;
  p->crop_h = h;
  p->crop_w = w;
  if (in_ratio < o.crop_ratio[0]) {
    p->crop_h = static_cast<int>(std::nearbyint(w / o.crop_ratio[0]));
  } else if (in_ratio > o.crop_ratio[1]) {
    p->crop_w = static_cast<int>(std::nearbyint(h * o.crop_ratio[1]));
  }
  p->top = (h - p->crop_h) / 2;
  p->left = (w - p->crop_w) / 2;
}

// TrivialAugmentWide: op (counter 200), magnitude bin (201), sign (202).
void DrawTrivial(uint64_t key, AugmentParams* p) {
  const int op = std::min(kTrivialOps - 1, static_cast<int>(UniformAt(key, 200) * kTrivialOps));
  const int bin = std::min(kTrivialBins - 1, static_cast<int>(UniformAt(key, 201) * kTrivialBins));
  p->trivial_op = static_cast<TrivialOp>(op);
  p->trivial_magnitude = TrivialMagnitude(p->trivial_op, bin);
  if (TrivialOpSigned(p->trivial_op) && UniformAt(key, 202) >= 0.5) p->trivial_magnitude *= -1.0;
}

// ColorJitter: the factors (counters 210..213; each a float32 value, as
// torch's uniform_ on a float tensor) and the order (214..216).
void DrawJitter(const AugmentOptions& o, uint64_t key, AugmentParams* p) {
  for (int k = 0; k < 4; ++k) {
    const double x = o.color_jitter[k];
    const double lo = k < 3 ? std::max(0.0, 1.0 - x) : -x, hi = k < 3 ? 1.0 + x : x;
    p->jitter[k] = static_cast<float>(lo + (hi - lo) * UniformAt(key, 210 + k));
  }
  std::array<int, 4> order{0, 1, 2, 3};
  for (int k = 0; k < 3; ++k) {
    const int i = 3 - k;  // position filled by this swap
    const int j = std::min(i, static_cast<int>(UniformAt(key, 214 + k) * (i + 1)));
    std::swap(order[i], order[j]);
  }
  p->jitter_order = order;
}

bool Jitters(const AugmentOptions& o) {
  return std::any_of(o.color_jitter.begin(), o.color_jitter.end(), [](double x) { return x > 0; });
}

}  // namespace

AugmentParams DrawAugmentParams(int h, int w, const AugmentOptions& options, uint64_t seed,
                                int64_t epoch, int64_t sample_index) {
  const uint64_t key = StreamKey(seed, static_cast<uint64_t>(epoch),
                                 static_cast<uint64_t>(sample_index), kAugmentStream);
  AugmentParams p;
  if (options.random_resized_crop) {
    DrawResizedCrop(h, w, options, key, &p);
  } else {
    p.top = CropOffset(h + 2 * options.pad, options.out_h, options.random_crop, key, 0);
    p.left = CropOffset(w + 2 * options.pad, options.out_w, options.random_crop, key, 1);
  }
  if (options.hflip && options.alternate_flip) {
    // The epoch-0 draw, then flipped every odd epoch.
    const uint64_t key0 = StreamKey(seed, 0, static_cast<uint64_t>(sample_index), kAugmentStream);
    p.flip = (UniformAt(key0, 2) < 0.5) != ((epoch & 1) != 0);
  } else {
    p.flip = options.hflip && UniformAt(key, 2) < 0.5;
  }
  if (options.erase_p > 0 && UniformAt(key, 3) < options.erase_p) {
    DrawErase(options, key, &p);
  }
  if (options.trivial_augment) DrawTrivial(key, &p);
  if (Jitters(options)) DrawJitter(options, key, &p);
  return p;
}

std::string CropFlipUnsupported(const AugmentOptions& o) {
  if (o.resize_min_side > 0) return "resize_min_side";
  if (o.random_resized_crop) return "random_resized_crop";
  if (o.erase_p > 0) return "erase";
  if (o.trivial_augment) return "trivial_augment";
  if (Jitters(o)) return "color_jitter";
  return "";
}

CropFlipGeometry CropFlipGeometryOf(const AugmentOptions& o, int c, int h, int w) {
  CropFlipGeometry g;
  g.channels = c;
  g.h = h;
  g.w = w;
  g.out_h = o.out_h;
  g.out_w = o.out_w;
  g.pad = o.pad;
  g.reflect = o.pad_mode == PadMode::kReflect && o.pad > 0;
  return g;
}

CropFlipDraw DrawCropFlip(const AugmentOptions& o, int h, int w, uint64_t seed, int64_t epoch,
                          int64_t sample_index, int32_t image) {
  const AugmentParams p = DrawAugmentParams(h, w, o, seed, epoch, sample_index);
  return {image, p.top, p.left, p.flip ? 1 : 0};
}

void CropFlipNormalisation(const AugmentOptions& o, int c, std::vector<float>* mean,
                           std::vector<float>* std) {
  mean->resize(c);
  std->resize(c);
  for (int ch = 0; ch < c; ++ch) {
    (*mean)[ch] = ChannelValue(o.mean, ch, 0.f);
    (*std)[ch] = ChannelValue(o.std, ch, 1.f);
  }
}

namespace {

// [lo, hi] with 0 < lo <= hi (and hi <= 1 for a fraction of an area).
void CheckRange(const char* key, const std::array<double, 2>& v, bool fraction) {
  if (!(v[0] > 0 && v[0] <= v[1] && std::isfinite(v[1]) && (!fraction || v[1] <= 1))) {
    throw ConfigError(StrCat("augment: ", key, " must be [lo, hi] with 0 < lo <= hi",
                             fraction ? " <= 1" : "", ", got [", v[0], ", ", v[1], "]"));
  }
}

// The image the crop reads, after resize_min_side and a random resized
// crop (which cuts and resizes its region to the output: read at (0, 0),
// unpadded). It owns its buffers: per-call, not thread_locals, since
// OpenCV's resize runs TBB tasks and a waiting thread may pick up another
// sample's augmentation.
struct CropSource {
  const uint8_t* px = nullptr;
  ImageSize size;
  AugmentParams at;  // the crop's top, left and flip
  int pad = 0;
  std::unique_ptr<uint8_t[]> resized, cropped;
};

CropSource ResizeForCrop(const uint8_t* hwc, int h, int w, int c, const AugmentParams& params,
                         const AugmentOptions& o) {
  CropSource s;
  s.px = hwc;
  s.size = ResizedSize(h, w, o.resize_min_side);
  s.at = params;
  s.pad = o.pad;
  if (s.size.h != h || s.size.w != w) {
    s.resized.reset(new uint8_t[static_cast<size_t>(s.size.h) * s.size.w * c]);
    Resize(hwc, h, w, c, cv::Rect(0, 0, w, h), s.size, s.resized.get());
    s.px = s.resized.get();
  }
  if (params.crop_h > 0 && params.crop_w > 0) {
    CNNFLOW_ENFORCE(params.top >= 0 && params.left >= 0 && params.top + params.crop_h <= s.size.h &&
                        params.left + params.crop_w <= s.size.w,
                    "augment: the resized crop leaves the ", s.size.h, "x", s.size.w, " image");
    const ImageSize out{o.out_h, o.out_w};
    s.cropped.reset(new uint8_t[static_cast<size_t>(out.h) * out.w * c]);
    Resize(s.px, s.size.h, s.size.w, c,
           cv::Rect(params.left, params.top, params.crop_w, params.crop_h), out, s.cropped.get());
    s.px = s.cropped.get();
    s.size = out;
    s.at.top = s.at.left = 0;
    s.pad = 0;
  }
  return s;
}

// ColorJitter's op (0 brightness, 1 contrast, 2 saturation, 3 hue) by factor.
void Jitter(const ChwF& f, int op, double factor) {
  switch (op) {
    case 0:
      AdjustBrightness(f, factor);
      break;
    case 1:
      AdjustContrast(f, factor);
      break;
    case 2:
      AdjustSaturation(f, factor);
      break;
    default:
      AdjustHue(f, factor);
  }
}

// Random erasing: zeros the drawn rectangle of every channel of chw [c, out_h, out_w].
void Erase(const AugmentParams& p, int out_h, int out_w, int c, float* chw) {
  CNNFLOW_ENFORCE(p.erase_top >= 0 && p.erase_left >= 0 && p.erase_top + p.erase_h <= out_h &&
                      p.erase_left + p.erase_w <= out_w,
                  "augment: the erased rectangle leaves the ", out_h, "x", out_w, " output");
  for (int ch = 0; ch < c; ++ch) {
    for (int y = p.erase_top; y < p.erase_top + p.erase_h; ++y) {
      float* row = chw + (int64_t{ch} * out_h + y) * out_w + p.erase_left;
      std::fill(row, row + p.erase_w, 0.f);
    }
  }
}

}  // namespace

void UseSerialOpenCv() {
  // Debian's OpenCV runs cv::resize & co. on TBB. Called from our own TBB
  // workers, that work would (1) take threads outside the configured thread
  // budget (OpenCV keeps its own arena), and (2) make the calling worker wait
  // inside cv::resize, where TBB may hand it another sample's task: that
  // task would reuse this thread's thread_local decode buffers while the
  // outer resize still reads them. The loaders already run one sample per
  // worker, so OpenCV gains nothing from its own parallelism here.
  static const bool once = [] {
    cv::setNumThreads(1);
    return true;
  }();
  (void)once;
}

Augmenter::Augmenter(AugmentOptions options) : options_(std::move(options)) {
  UseSerialOpenCv();
  const AugmentOptions& o = options_;
  if (o.out_h <= 0 || o.out_w <= 0) {
    throw ConfigError(StrCat("augment: output size must be positive, got ", o.out_h, "x", o.out_w));
  }
  if (o.pad < 0 || o.resize_min_side < 0) {
    throw ConfigError(StrCat("augment: pad and resize must be >= 0, got pad ", o.pad, ", resize ",
                             o.resize_min_side));
  }
  if (o.pad_mode == PadMode::kReflect && o.resize_min_side > 0 && o.pad >= o.resize_min_side) {
    throw ConfigError(StrCat("augment: pad_mode: reflect needs pad < the image's sides, but pad ",
                             o.pad, " >= resize_min_side ", o.resize_min_side));
  }
  if (o.random_resized_crop && (o.pad != 0 || o.random_crop)) {
    throw ConfigError(
        StrCat("augment: random_resized_crop takes the place of pad and random_crop; "
               "got pad ",
               o.pad, (o.random_crop ? ", random_crop true" : "")));
  }
  CheckRange("crop_scale", o.crop_scale, true);
  CheckRange("crop_ratio", o.crop_ratio, false);
  CheckRange("erase_scale", o.erase_scale, true);
  CheckRange("erase_ratio", o.erase_ratio, false);
  static constexpr const char* kJitterNames[4] = {"brightness", "contrast", "saturation", "hue"};
  for (int k = 0; k < 4; ++k) {
    const double x = o.color_jitter[k];
    const double hi = k < 3 ? std::numeric_limits<double>::infinity() : 0.5;
    if (!(x >= 0 && x <= hi && std::isfinite(x))) {
      throw ConfigError(StrCat("augment: color_jitter's ", kJitterNames[k], " (value ", k + 1,
                               " of [brightness, contrast, saturation, hue]) must be ",
                               k < 3 ? ">= 0 (finite)" : "in [0, 0.5]", ", got ", x));
    }
  }
  if (!(o.erase_p >= 0 && o.erase_p <= 1)) {
    throw ConfigError(StrCat("augment: erase (a probability) must be in [0, 1], got ", o.erase_p));
  }
  const size_t n = std::max<size_t>({o.mean.size(), o.std.size(), 1});
  if (n > kMaxChannels || (o.mean.size() > 1 && o.mean.size() != n) ||
      (o.std.size() > 1 && o.std.size() != n)) {
    throw ConfigError(StrCat("augment: mean (", o.mean.size(), " values) and std (", o.std.size(),
                             " values) must each have 1 value or one per channel (at most ",
                             kMaxChannels, ")"));
  }
  norm_channels_ = static_cast<int>(n);
  lut_.resize(n * 256);
  for (size_t ch = 0; ch < n; ++ch) {
    const float mean = ChannelValue(o.mean, ch, 0.f);
    const float std = ChannelValue(o.std, ch, 1.f);
    if (!(std::isfinite(std) && std != 0.f) || !std::isfinite(mean)) {
      throw ConfigError(StrCat("augment: channel ", ch, " has mean ", mean, ", std ", std,
                               " (std must be finite and non-zero)"));
    }
    for (int v = 0; v < 256; ++v) {
      lut_[ch * 256 + v] = NormalisePixel(static_cast<uint8_t>(v), mean, std);
    }
  }
  for (int ch = 0; ch < kMaxChannels; ++ch) {
    const size_t k = norm_channels_ == 1 ? 0 : std::min<size_t>(ch, n - 1);
    mean_[ch] = ChannelValue(o.mean, k, 0.f);
    std_[ch] = ChannelValue(o.std, k, 1.f);
  }
}

void Augmenter::Run(const uint8_t* hwc, int h, int w, int c, uint64_t seed, int64_t epoch,
                    int64_t sample_index, float* chw_out) const {
  const ImageSize rs = ResizedSize(h, w, options_.resize_min_side);
  RunWithParams(hwc, h, w, c, DrawAugmentParams(rs.h, rs.w, options_, seed, epoch, sample_index),
                chw_out);
}

void Augmenter::RunWithParams(const uint8_t* hwc, int h, int w, int c, const AugmentParams& params,
                              float* chw_out) const {
  CNNFLOW_ENFORCE(h > 0 && w > 0 && c >= 1 && c <= kMaxChannels,
                  "augment: image must be [h, w, c] with c in 1..4, got [", h, ", ", w, ", ", c,
                  "]");
  CNNFLOW_ENFORCE(norm_channels_ == 1 || norm_channels_ == c, "augment: mean/std have ",
                  norm_channels_, " values but the image has ", c, " channels");
  const AugmentOptions& o = options_;
  const CropSource src = ResizeForCrop(hwc, h, w, c, params, o);
  const ImageSize size = src.size;
  const bool reflect = o.pad_mode == PadMode::kReflect && src.pad > 0;
  if (reflect && (src.pad >= size.h || src.pad >= size.w)) {
    throw ConfigError(StrCat("augment: pad_mode: reflect needs pad < the image's sides, but pad ",
                             src.pad, " on a ", size.h, "x", size.w, " image",
                             size.h != h || size.w != w ? " (after resize_min_side)" : ""));
  }
  const bool trivial = params.trivial_op != TrivialOp::kIdentity;
  const bool jitter = Jitters(o);
  // Checked whatever the draw, so a 4-channel source fails at once.
  CNNFLOW_ENFORCE(!(o.trivial_augment || jitter) || c == 1 || c == 3,
                  "augment: trivial_augment and color_jitter need 1 or 3 channels, got ", c);
  if (!trivial && !jitter) {
    GatherNormalised(src.px, size, c, src.pad, reflect, src.at, chw_out);
  } else {
    // The crop and flip as uint8, TrivialAugmentWide on it (uint8, as
    // torchvision on a uint8 tensor), then ColorJitter on v / 255 and the
    // normalisation, or without ColorJitter the table's normalisation.
    std::vector<uint8_t> crop(int64_t{o.out_h} * o.out_w * c);
    CropU8(src.px, size.h, size.w, c, src.pad, reflect, src.at, o.out_h, o.out_w, crop.data());
    const HwcU8 img{crop.data(), o.out_h, o.out_w, c};
    if (trivial) ApplyTrivialOp(params.trivial_op, params.trivial_magnitude, img);
    if (!jitter) {
      GatherNormalised(crop.data(), ImageSize{o.out_h, o.out_w}, c, 0, false, AugmentParams{},
                       chw_out);
    } else {
      JitterAndNormalise(crop.data(), c, params, chw_out);
    }
  }
  if (params.erase_h > 0 && params.erase_w > 0) Erase(params, o.out_h, o.out_w, c, chw_out);
}

void Augmenter::GatherNormalised(const uint8_t* from, ImageSize size, int c, int pad, bool reflect,
                                 const AugmentParams& p, float* chw_out) const {
  const AugmentOptions& o = options_;
  const int lut_stride = norm_channels_ == 1 ? 0 : 256;
  switch (c) {
    case 1:
      Gather<1>(from, size.h, size.w, c, pad, reflect, p, o.out_h, o.out_w, lut_.data(), lut_stride,
                mean_.data(), std_.data(), chw_out);
      break;
    case 3:
      Gather<3>(from, size.h, size.w, c, pad, reflect, p, o.out_h, o.out_w, lut_.data(), lut_stride,
                mean_.data(), std_.data(), chw_out);
      break;
    default:
      Gather<0>(from, size.h, size.w, c, pad, reflect, p, o.out_h, o.out_w, lut_.data(), lut_stride,
                mean_.data(), std_.data(), chw_out);
  }
}

void Augmenter::JitterAndNormalise(const uint8_t* crop, int c, const AugmentParams& params,
                                   float* chw_out) const {
  const AugmentOptions& o = options_;
  const int64_t plane = int64_t{o.out_h} * o.out_w;
  for (int ch = 0; ch < c; ++ch) {
    for (int64_t i = 0; i < plane; ++i) {
      chw_out[ch * plane + i] = static_cast<float>(crop[i * c + ch]) / 255.f;
    }
  }
  const ChwF f{chw_out, o.out_h, o.out_w, c};
  for (const int op : params.jitter_order) {
    if (o.color_jitter[op] > 0) Jitter(f, op, params.jitter[op]);
  }
  for (int ch = 0; ch < c; ++ch) {
    float* p = chw_out + ch * plane;
    for (int64_t i = 0; i < plane; ++i) p[i] = (p[i] - mean_[ch]) / std_[ch];
  }
}

void Augment(const uint8_t* hwc, int h, int w, int c, const AugmentOptions& options, uint64_t seed,
             int64_t epoch, int64_t sample_index, float* chw_out) {
  Augmenter(options).Run(hwc, h, w, c, seed, epoch, sample_index, chw_out);
}

}  // namespace cnnflow
