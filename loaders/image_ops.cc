#include "loaders/image_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/error.h"

namespace cnnflow {

namespace {

// torchvision's rgb_to_grayscale weights, as float32 (the tensor op casts
// the Python scalars to the image's float type).
constexpr float kGrayR = 0.2989f, kGrayG = 0.587f, kGrayB = 0.114f;

float Gray(float r, float g, float b) { return kGrayR * r + kGrayG * g + kGrayB * b; }

// _blend on uint8: ratio * a + (1.0 - ratio) * b in float32 (the ratio and
// its complement computed in double, then cast), clamped to [0, 255] and
// truncated as Tensor.to(torch.uint8).
struct BlendU8 {
  float r, r1;
  explicit BlendU8(double ratio)
      : r(static_cast<float>(ratio)), r1(static_cast<float>(1.0 - ratio)) {}
  uint8_t operator()(uint8_t a, float b) const {
    const float v = r * static_cast<float>(a) + r1 * b;
    return static_cast<uint8_t>(std::clamp(v, 0.f, 255.f));
  }
};

// _blend on float images: clamped to [0, 1].
struct BlendF {
  float r, r1;
  explicit BlendF(double ratio)
      : r(static_cast<float>(ratio)), r1(static_cast<float>(1.0 - ratio)) {}
  float operator()(float a, float b) const { return std::clamp(r * a + r1 * b, 0.f, 1.f); }
};

int64_t Pixels(int h, int w) { return int64_t{h} * w; }

void CheckChannels(int c, const char* op) {
  CNNFLOW_ENFORCE(c == 1 || c == 3, op, ": images must have 1 or 3 channels, got ", c);
}

// The per-pixel grayscale of a uint8 RGB image, truncated to uint8 as
// rgb_to_grayscale(...).to(uint8).
std::vector<uint8_t> GrayU8(const HwcU8& img) {
  const int64_t n = Pixels(img.h, img.w);
  std::vector<uint8_t> g(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* p = img.data + 3 * i;
    g[i] = static_cast<uint8_t>(Gray(p[0], p[1], p[2]));
  }
  return g;
}

}  // namespace

void AdjustBrightness(HwcU8 img, double factor) {
  CheckChannels(img.c, "adjust_brightness");
  const BlendU8 blend(factor);
  const int64_t n = Pixels(img.h, img.w) * img.c;
  for (int64_t i = 0; i < n; ++i) img.data[i] = blend(img.data[i], 0.f);
}

void AdjustBrightness(ChwF img, double factor) {
  CheckChannels(img.c, "adjust_brightness");
  const BlendF blend(factor);
  const int64_t n = Pixels(img.h, img.w) * img.c;
  for (int64_t i = 0; i < n; ++i) img.data[i] = blend(img.data[i], 0.f);
}

void AdjustContrast(HwcU8 img, double factor) {
  CheckChannels(img.c, "adjust_contrast");
  const int64_t n = Pixels(img.h, img.w);
  // The mean of the (uint8) grayscale as float32: the integer sum is exact
  // as torch's float32 sum is below 2^24 (images up to ~256 x 256).
  int64_t sum = 0;
  if (img.c == 3) {
    for (uint8_t g : GrayU8(img)) sum += g;
  } else {
    for (int64_t i = 0; i < n; ++i) sum += img.data[i];
  }
  const float mean = static_cast<float>(sum) / static_cast<float>(n);
  const BlendU8 blend(factor);
  for (int64_t i = 0; i < n * img.c; ++i) img.data[i] = blend(img.data[i], mean);
}

void AdjustContrast(ChwF img, double factor) {
  CheckChannels(img.c, "adjust_contrast");
  const int64_t n = Pixels(img.h, img.w);
  double sum = 0;
  if (img.c == 3) {
    const float *r = img.data, *g = r + n, *b = g + n;
    for (int64_t i = 0; i < n; ++i) sum += Gray(r[i], g[i], b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) sum += img.data[i];
  }
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const BlendF blend(factor);
  for (int64_t i = 0; i < n * img.c; ++i) img.data[i] = blend(img.data[i], mean);
}

void AdjustSaturation(HwcU8 img, double factor) {
  CheckChannels(img.c, "adjust_saturation");
  if (img.c == 1) return;
  const std::vector<uint8_t> gray = GrayU8(img);
  const BlendU8 blend(factor);
  for (size_t i = 0; i < gray.size(); ++i) {
    for (int ch = 0; ch < 3; ++ch) img.data[3 * i + ch] = blend(img.data[3 * i + ch], gray[i]);
  }
}

void AdjustSaturation(ChwF img, double factor) {
  CheckChannels(img.c, "adjust_saturation");
  if (img.c == 1) return;
  const int64_t n = Pixels(img.h, img.w);
  float *r = img.data, *g = r + n, *b = g + n;
  const BlendF blend(factor);
  for (int64_t i = 0; i < n; ++i) {
    const float gray = Gray(r[i], g[i], b[i]);
    r[i] = blend(r[i], gray);
    g[i] = blend(g[i], gray);
    b[i] = blend(b[i], gray);
  }
}

void AdjustHue(ChwF img, double shift) {
  CheckChannels(img.c, "adjust_hue");
  CNNFLOW_ENFORCE(shift >= -0.5 && shift <= 0.5, "adjust_hue: shift ", shift,
                  " is not in [-0.5, 0.5]");
  if (img.c == 1) return;
  const int64_t n = Pixels(img.h, img.w);
  float *rp = img.data, *gp = rp + n, *bp = gp + n;
  const float hue_shift = static_cast<float>(shift);
  for (int64_t i = 0; i < n; ++i) {
    const float r = rp[i], g = gp[i], b = bp[i];
    // _rgb2hsv (Pillow's algorithm): the divisors are 1 where max == min.
    const float maxc = std::max({r, g, b}), minc = std::min({r, g, b});
    const bool eqc = maxc == minc;
    const float cr = maxc - minc;
    const float s = cr / (eqc ? 1.f : maxc);
    const float div = eqc ? 1.f : cr;
    const float rc = (maxc - r) / div, gc = (maxc - g) / div, bc = (maxc - b) / div;
    float h;
    if (maxc == r) {
      h = bc - gc;
    } else if (maxc == g) {
      h = 2.f + rc - bc;
    } else {
      h = 4.f + gc - rc;
    }
    // fmod(h / 6 + 1, 1), then (h + shift) % 1.0 (torch's remainder: fmod,
    // moved to the divisor's sign). The arguments lie in [5/6, 2) and
    // [-0.5, 1.5), where x - 1 is exact (Sterbenz), so the subtractions are
    // fmod's results bitwise, at a fraction of its cost.
    h = h / 6.f + 1.f;
    if (h >= 1.f) h -= 1.f;
    h += hue_shift;
    if (h >= 1.f) {
      h -= 1.f;
    } else if (h < 0.f) {
      h += 1.f;
    }
    // _hsv2rgb.
    const float v = maxc;
    const float h6 = h * 6.f;
    const float fi = std::floor(h6);
    const float f = h6 - fi;
    const int sector = ((static_cast<int>(fi) % 6) + 6) % 6;
    const float p = std::clamp(v * (1.f - s), 0.f, 1.f);
    const float q = std::clamp(v * (1.f - s * f), 0.f, 1.f);
    const float t = std::clamp(v * (1.f - s * (1.f - f)), 0.f, 1.f);
    static constexpr int kPick[6][3] = {{0, 3, 1}, {2, 0, 1}, {1, 0, 3},
                                        {1, 2, 0}, {3, 1, 0}, {0, 1, 2}};
    const float vals[4] = {v, p, q, t};
    rp[i] = vals[kPick[sector][0]];
    gp[i] = vals[kPick[sector][1]];
    bp[i] = vals[kPick[sector][2]];
  }
}

void AdjustSharpness(HwcU8 img, double factor) {
  CheckChannels(img.c, "adjust_sharpness");
  const int h = img.h, w = img.w, c = img.c;
  if (h <= 2 || w <= 2) return;
  // The kernel as torchvision builds it: ones, 5 at the centre, divided by
  // its sum in float32.
  const float k1 = 1.f / 13.f, k5 = 5.f / 13.f;
  std::vector<uint8_t> blurred(img.data, img.data + Pixels(h, w) * c);
  for (int y = 1; y < h - 1; ++y) {
    for (int x = 1; x < w - 1; ++x) {
      for (int ch = 0; ch < c; ++ch) {
        float sum = 0.f;
        for (int dy = -1; dy <= 1; ++dy) {
          for (int dx = -1; dx <= 1; ++dx) {
            const float k = dy == 0 && dx == 0 ? k5 : k1;
            sum += k * static_cast<float>(img.data[((y + dy) * w + (x + dx)) * c + ch]);
          }
        }
        blurred[(y * w + x) * c + ch] =
            static_cast<uint8_t>(std::clamp(std::nearbyint(sum), 0.f, 255.f));
      }
    }
  }
  const BlendU8 blend(factor);
  for (size_t i = 0; i < blurred.size(); ++i) img.data[i] = blend(img.data[i], blurred[i]);
}

void Posterize(HwcU8 img, int bits) {
  CNNFLOW_ENFORCE(bits >= 0 && bits <= 8, "posterize: bits must be in 0..8, got ", bits);
  const uint8_t mask = static_cast<uint8_t>(0xFF00 >> bits);
  const int64_t n = Pixels(img.h, img.w) * img.c;
  for (int64_t i = 0; i < n; ++i) img.data[i] &= mask;
}

void Solarize(HwcU8 img, double threshold) {
  const int64_t n = Pixels(img.h, img.w) * img.c;
  for (int64_t i = 0; i < n; ++i) {
    if (img.data[i] >= threshold) img.data[i] = static_cast<uint8_t>(255 - img.data[i]);
  }
}

void AutoContrast(HwcU8 img) {
  const int64_t n = Pixels(img.h, img.w);
  for (int ch = 0; ch < img.c; ++ch) {
    uint8_t lo = 255, hi = 0;
    for (int64_t i = 0; i < n; ++i) {
      lo = std::min(lo, img.data[i * img.c + ch]);
      hi = std::max(hi, img.data[i * img.c + ch]);
    }
    if (lo == hi) continue;  // scale inf: minimum 0, scale 1, unchanged
    // bound / (max - min) on a tensor is Tensor.__rtruediv__: the reciprocal
    // times 255.
    const float minimum = lo, scale = (1.f / (static_cast<float>(hi) - minimum)) * 255.f;
    for (int64_t i = 0; i < n; ++i) {
      uint8_t& v = img.data[i * img.c + ch];
      v = static_cast<uint8_t>(std::clamp((static_cast<float>(v) - minimum) * scale, 0.f, 255.f));
    }
  }
}

void Equalize(HwcU8 img) {
  const int64_t n = Pixels(img.h, img.w);
  for (int ch = 0; ch < img.c; ++ch) {
    std::array<int64_t, 256> hist{};
    for (int64_t i = 0; i < n; ++i) ++hist[img.data[i * img.c + ch]];
    int last = 255;
    while (hist[last] == 0) --last;
    const int64_t step = (n - hist[last]) / 255;
    if (step == 0) continue;
    // lut[v] = (count of values < v + step / 2) / step, at most 255.
    std::array<uint8_t, 256> lut{};
    int64_t below = 0;
    for (int v = 0; v < 256; ++v) {
      lut[v] = static_cast<uint8_t>(std::min<int64_t>((below + step / 2) / step, 255));
      below += hist[v];
    }
    for (int64_t i = 0; i < n; ++i) {
      uint8_t& v = img.data[i * img.c + ch];
      v = lut[v];
    }
  }
}

std::array<double, 6> InverseAffineMatrix(std::array<double, 2> center, double angle,
                                          std::array<double, 2> translate,
                                          std::array<double, 2> shear) {
  constexpr double kDegToRad = M_PI / 180.0;  // as Python's math.radians
  const double rot = angle * kDegToRad, sx = shear[0] * kDegToRad, sy = shear[1] * kDegToRad;
  const double cx = center[0], cy = center[1], tx = translate[0], ty = translate[1];
  // Rotation * shear (without scale), as torchvision writes it.
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -std::cos(rot - sy) * std::tan(sx) / std::cos(sy) - std::sin(rot);
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = -std::sin(rot - sy) * std::tan(sx) / std::cos(sy) + std::cos(rot);
  // Its inverse (determinant 1), then the inverse translations, then the
  // centre back.
  std::array<double, 6> m{d, -b, 0.0, -c, a, 0.0};
  m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
  m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
  m[2] += cx;
  m[5] += cy;
  return m;
}

void AffineNearest(const HwcU8& src, const std::array<double, 6>& inverse, uint8_t* dst) {
  const int h = src.h, w = src.w, c = src.c;
  // The grid as torchvision's _gen_affine_grid builds it in float32: the
  // matrix divided by the half sizes, applied to pixel centres relative to
  // the image centre; grid_sample's unnormalisation back to pixels.
  const float half_w = 0.5f * static_cast<float>(w), half_h = 0.5f * static_cast<float>(h);
  float t[6];
  for (int k = 0; k < 6; ++k) t[k] = static_cast<float>(inverse[k]);
  const float ax = t[0] / half_w, bx = t[1] / half_w, cx = t[2] / half_w;
  const float ay = t[3] / half_h, by = t[4] / half_h, cy = t[5] / half_h;
  const float fw = static_cast<float>(w), fh = static_cast<float>(h);
  for (int i = 0; i < h; ++i) {
    const float y = static_cast<float>(i) - half_h + 0.5f;
    for (int j = 0; j < w; ++j) {
      const float x = static_cast<float>(j) - half_w + 0.5f;
      const float gx = x * ax + y * bx + cx, gy = x * ay + y * by + cy;
      const float ix = std::nearbyint(((gx + 1.f) * fw - 1.f) / 2.f);
      const float iy = std::nearbyint(((gy + 1.f) * fh - 1.f) / 2.f);
      uint8_t* out = dst + (int64_t{i} * w + j) * c;
      if (ix >= 0.f && ix < fw && iy >= 0.f && iy < fh) {
        std::memcpy(out, src.data + (static_cast<int64_t>(iy) * w + static_cast<int64_t>(ix)) * c,
                    c);
      } else {
        std::memset(out, 0, c);
      }
    }
  }
}

const char* TrivialOpName(TrivialOp op) {
  static constexpr const char* kNames[kTrivialOps] = {
      "Identity", "ShearX",   "ShearY",    "TranslateX", "TranslateY", "Rotate",       "Brightness",
      "Color",    "Contrast", "Sharpness", "Posterize",  "Solarize",   "AutoContrast", "Equalize"};
  const int k = static_cast<int>(op);
  return k >= 0 && k < kTrivialOps ? kNames[k] : "?";
}

bool TrivialOpSigned(TrivialOp op) {
  return op >= TrivialOp::kShearX && op <= TrivialOp::kSharpness;
}

double TrivialMagnitude(TrivialOp op, int bin) {
  CNNFLOW_ENFORCE(bin >= 0 && bin < kTrivialBins, "TrivialAugmentWide: bin ", bin, " is not in 0..",
                  kTrivialBins - 1);
  const double t = bin / 30.0;
  double m = 0;
  switch (op) {
    case TrivialOp::kShearX:
    case TrivialOp::kShearY:
    case TrivialOp::kBrightness:
    case TrivialOp::kColor:
    case TrivialOp::kContrast:
    case TrivialOp::kSharpness:
      m = 0.99 * t;
      break;
    case TrivialOp::kTranslateX:
    case TrivialOp::kTranslateY:
      m = 32.0 * t;
      break;
    case TrivialOp::kRotate:
      m = 135.0 * t;
      break;
    case TrivialOp::kPosterize:
      return 8.0 - std::nearbyint(bin / 5.0);
    case TrivialOp::kSolarize:
      m = 255.0 - 8.5 * bin;
      break;
    default:
      return 0.0;
  }
  return static_cast<double>(static_cast<float>(m));
}

void ApplyTrivialOp(TrivialOp op, double magnitude, HwcU8 img) {
  CheckChannels(img.c, "TrivialAugmentWide");
  constexpr double kRadToDeg = 180.0 / M_PI;  // as Python's math.degrees
  auto affine = [&](std::array<double, 2> center, double angle, std::array<double, 2> translate,
                    std::array<double, 2> shear) {
    std::vector<uint8_t> src(img.data, img.data + Pixels(img.h, img.w) * img.c);
    AffineNearest(HwcU8{src.data(), img.h, img.w, img.c},
                  InverseAffineMatrix(center, angle, translate, shear), img.data);
  };
  // The shears' centre is pixel (0, 0), the top-left corner, in centred
  // coordinates.
  const std::array<double, 2> corner{-0.5 * img.w, -0.5 * img.h};
  switch (op) {
    case TrivialOp::kIdentity:
      break;
    case TrivialOp::kShearX:
      affine(corner, 0.0, {0.0, 0.0}, {std::atan(magnitude) * kRadToDeg, 0.0});
      break;
    case TrivialOp::kShearY:
      affine(corner, 0.0, {0.0, 0.0}, {0.0, std::atan(magnitude) * kRadToDeg});
      break;
    case TrivialOp::kTranslateX:
      affine({0.0, 0.0}, 0.0, {std::trunc(magnitude), 0.0}, {0.0, 0.0});
      break;
    case TrivialOp::kTranslateY:
      affine({0.0, 0.0}, 0.0, {0.0, std::trunc(magnitude)}, {0.0, 0.0});
      break;
    case TrivialOp::kRotate:  // F.rotate: the affine angle is -magnitude
      affine({0.0, 0.0}, -magnitude, {0.0, 0.0}, {0.0, 0.0});
      break;
    case TrivialOp::kBrightness:
      AdjustBrightness(img, 1.0 + magnitude);
      break;
    case TrivialOp::kColor:
      AdjustSaturation(img, 1.0 + magnitude);
      break;
    case TrivialOp::kContrast:
      AdjustContrast(img, 1.0 + magnitude);
      break;
    case TrivialOp::kSharpness:
      AdjustSharpness(img, 1.0 + magnitude);
      break;
    case TrivialOp::kPosterize:
      Posterize(img, static_cast<int>(magnitude));
      break;
    case TrivialOp::kSolarize:
      Solarize(img, magnitude);
      break;
    case TrivialOp::kAutoContrast:
      AutoContrast(img);
      break;
    case TrivialOp::kEqualize:
      Equalize(img);
      break;
  }
}

}  // namespace cnnflow
