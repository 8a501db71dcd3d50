// loaders/image_ops: each of torchvision's ops against a reference written
// out here from its definition (blends in double, a textbook RGB -> HSV ->
// RGB in degrees, PIL's equalize loop, the affine pixel maps in closed
// form), and TrivialAugmentWide's magnitude tables. The references compute
// in double: where a uint8 result's exact value lies within 1e-3 of a
// rounding boundary the float32 op may land on either side, so those few
// values are skipped (and counted). bench/augment_vs_torchvision.py checks
// the same ops bitwise against torchvision itself.
#include "loaders/image_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/error.h"
#include "ops/random.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

using testing::RandomImage;

// [h, w, c] uint8 -> [c, h, w] v / 255.
std::vector<float> ToChw(const std::vector<uint8_t>& hwc, int h, int w, int c) {
  std::vector<float> out(hwc.size());
  for (int i = 0; i < h * w; ++i) {
    for (int ch = 0; ch < c; ++ch) out[ch * h * w + i] = hwc[i * c + ch] / 255.f;
  }
  return out;
}

double GrayD(double r, double g, double b) { return 0.2989 * r + 0.587 * g + 0.114 * b; }

// Counts the uint8 values compared and the ones skipped as too close to a
// truncation boundary.
struct U8Check {
  int compared = 0, skipped = 0;
  // exact: the reference's real value before truncation to uint8.
  void Expect(double exact, uint8_t got, const char* what, int i) {
    if (exact > 0.5 && exact < 255.5 && std::abs(exact - std::round(exact)) < 1e-3) {
      ++skipped;
      return;
    }
    const double v = std::clamp(exact, 0.0, 255.0);
    ++compared;
    EXPECT_EQ(got, static_cast<int>(std::floor(v)))
        << what << " at " << i << " (exact " << exact << ")";
  }
  void Done() const { EXPECT_LT(skipped, compared / 20 + 2) << "too many values skipped"; }
};

TEST(ImageOpsTest, FloatBlendsMatchTheirDefinitions) {
  const int h = 9, w = 11;
  const auto img = RandomImage(h, w, 3, 1);
  const auto x = ToChw(img, h, w, 3);
  const int n = h * w;
  for (double f : {0.0, 0.3, 1.0, 1.7, 3.0}) {
    SCOPED_TRACE(f);
    // Brightness: f v, clamped.
    auto b = x;
    AdjustBrightness(ChwF{b.data(), h, w, 3}, f);
    for (size_t i = 0; i < b.size(); ++i) {
      EXPECT_NEAR(b[i], std::clamp(f * x[i], 0.0, 1.0), 1e-6);
    }
    // Contrast: blend with the mean of the gray image.
    double mean = 0;
    for (int i = 0; i < n; ++i) mean += GrayD(x[i], x[n + i], x[2 * n + i]) / n;
    auto c = x;
    AdjustContrast(ChwF{c.data(), h, w, 3}, f);
    for (size_t i = 0; i < c.size(); ++i) {
      EXPECT_NEAR(c[i], std::clamp(f * x[i] + (1 - f) * mean, 0.0, 1.0), 2e-6);
    }
    // Saturation: blend each pixel with its gray.
    auto s = x;
    AdjustSaturation(ChwF{s.data(), h, w, 3}, f);
    for (int i = 0; i < n; ++i) {
      const double g = GrayD(x[i], x[n + i], x[2 * n + i]);
      for (int ch = 0; ch < 3; ++ch) {
        EXPECT_NEAR(s[ch * n + i], std::clamp(f * x[ch * n + i] + (1 - f) * g, 0.0, 1.0), 2e-6);
      }
    }
  }
  // One channel: contrast blends with the image's own mean; saturation and
  // hue leave it as it is.
  auto one = ToChw(RandomImage(h, w, 1, 2), h, w, 1);
  double mean = 0;
  for (float v : one) mean += v / n;
  auto c = one;
  AdjustContrast(ChwF{c.data(), h, w, 1}, 0.5);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(c[i], 0.5 * one[i] + 0.5 * mean, 2e-6);
  auto s = one;
  AdjustSaturation(ChwF{s.data(), h, w, 1}, 0.2);
  AdjustHue(ChwF{s.data(), h, w, 1}, 0.3);
  EXPECT_EQ(s, one);
}

// A textbook HSV (hue in degrees, chroma C, X, m), another route than
// torchvision's, for the hue shift.
std::array<double, 3> ShiftHue(double r, double g, double b, double shift) {
  const double mx = std::max({r, g, b}), mn = std::min({r, g, b}), delta = mx - mn;
  double hue = 0;
  if (delta > 0) {
    if (mx == r) {
      hue = 60 * std::fmod((g - b) / delta + 6, 6);
    } else if (mx == g) {
      hue = 60 * ((b - r) / delta + 2);
    } else {
      hue = 60 * ((r - g) / delta + 4);
    }
  }
  const double s = mx == 0 ? 0 : delta / mx, v = mx;
  hue = std::fmod(hue + 360 * shift + 720, 360);
  const double chroma = v * s, x = chroma * (1 - std::abs(std::fmod(hue / 60, 2) - 1)),
               m = v - chroma;
  std::array<double, 3> rgb;
  switch (static_cast<int>(hue / 60) % 6) {
    case 0:
      rgb = {chroma, x, 0};
      break;
    case 1:
      rgb = {x, chroma, 0};
      break;
    case 2:
      rgb = {0, chroma, x};
      break;
    case 3:
      rgb = {0, x, chroma};
      break;
    case 4:
      rgb = {x, 0, chroma};
      break;
    default:
      rgb = {chroma, 0, x};
  }
  return {rgb[0] + m, rgb[1] + m, rgb[2] + m};
}

TEST(ImageOpsTest, HueShiftMatchesATextbookHsv) {
  const int h = 12, w = 13, n = h * w;
  auto img = RandomImage(h, w, 3, 3);
  // Grays, pure primaries and black among them.
  const uint8_t special[][3] = {{0, 0, 0},   {255, 255, 255}, {90, 90, 90}, {255, 0, 0},
                                {0, 255, 0}, {0, 0, 255},     {255, 255, 0}};
  for (int k = 0; k < 7; ++k) std::copy_n(special[k], 3, &img[k * 3]);
  const auto x = ToChw(img, h, w, 3);
  for (double shift : {-0.5, -0.37, -0.1, 0.0, 0.05, 1.0 / 3.0, 0.49, 0.5}) {
    SCOPED_TRACE(shift);
    auto y = x;
    AdjustHue(ChwF{y.data(), h, w, 3}, shift);
    for (int i = 0; i < n; ++i) {
      const auto ref = ShiftHue(x[i], x[n + i], x[2 * n + i], shift);
      for (int ch = 0; ch < 3; ++ch) EXPECT_NEAR(y[ch * n + i], ref[ch], 2e-6) << i;
    }
  }
  // Red turned by a third is green, by half cyan.
  auto red = ToChw(std::vector<uint8_t>{255, 0, 0}, 1, 1, 3);
  AdjustHue(ChwF{red.data(), 1, 1, 3}, 1.0 / 3.0);
  EXPECT_NEAR(red[0], 0, 1e-6);
  EXPECT_NEAR(red[1], 1, 1e-6);
  EXPECT_NEAR(red[2], 0, 1e-6);
  EXPECT_THROW(AdjustHue(ChwF{red.data(), 1, 1, 3}, 0.6), Error);
}

TEST(ImageOpsTest, Uint8BlendsTruncateAsTorchvision) {
  const int h = 10, w = 9, n = h * w;
  const auto img = RandomImage(h, w, 3, 4);
  U8Check check;
  for (double f : {0.01, 0.53, 1.33, 1.99}) {
    SCOPED_TRACE(f);
    auto b = img;
    AdjustBrightness(HwcU8{b.data(), h, w, 3}, f);
    for (int i = 0; i < n * 3; ++i) check.Expect(f * img[i], b[i], "brightness", i);
    // Gray truncated to uint8, its mean not.
    std::vector<int> gray(n);
    double mean = 0;
    for (int i = 0; i < n; ++i) {
      gray[i] = static_cast<int>(GrayD(img[3 * i], img[3 * i + 1], img[3 * i + 2]));
      mean += gray[i] / static_cast<double>(n);
    }
    auto c = img;
    AdjustContrast(HwcU8{c.data(), h, w, 3}, f);
    for (int i = 0; i < n * 3; ++i) check.Expect(f * img[i] + (1 - f) * mean, c[i], "contrast", i);
    auto s = img;
    AdjustSaturation(HwcU8{s.data(), h, w, 3}, f);
    for (int i = 0; i < n * 3; ++i) {
      check.Expect(f * img[i] + (1 - f) * gray[i / 3], s[i], "saturation", i);
    }
    // Sharpness: the blur is (8 neighbours + 5 centre) / 13 rounded (never
    // a tie: 13 is odd), inside the border.
    auto sh = img;
    AdjustSharpness(HwcU8{sh.data(), h, w, 3}, f);
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        for (int ch = 0; ch < 3; ++ch) {
          const int i = (y * w + x) * 3 + ch;
          if (y == 0 || y == h - 1 || x == 0 || x == w - 1) {
            // The border blends v with itself: v, or v - 1 where float32's
            // f v + (1 - f) v lands just below v (torchvision's too).
            EXPECT_TRUE(sh[i] == img[i] || sh[i] + 1 == img[i]) << "sharpness border at " << i;
            continue;
          }
          int sum = 4 * img[i];
          for (int dy = -1; dy <= 1; ++dy) {
            for (int dx = -1; dx <= 1; ++dx) sum += img[((y + dy) * w + x + dx) * 3 + ch];
          }
          const double blurred = std::round(sum / 13.0);
          check.Expect(f * img[i] + (1 - f) * blurred, sh[i], "sharpness", i);
        }
      }
    }
  }
  check.Done();
  // Sharpness leaves images of side <= 2 alone.
  auto small = RandomImage(2, 5, 3, 5);
  const auto before = small;
  AdjustSharpness(HwcU8{small.data(), 2, 5, 3}, 0.2);
  EXPECT_EQ(small, before);
}

TEST(ImageOpsTest, PosterizeSolarizeAutoContrastByDefinition) {
  const int h = 7, w = 8, n = h * w;
  const auto img = RandomImage(h, w, 3, 6);
  for (int bits = 1; bits <= 8; ++bits) {
    auto p = img;
    Posterize(HwcU8{p.data(), h, w, 3}, bits);
    for (int i = 0; i < n * 3; ++i) EXPECT_EQ(p[i], (img[i] >> (8 - bits)) << (8 - bits));
  }
  for (double t : {0.0, 8.5, 128.0, 254.5, 255.0}) {
    auto s = img;
    Solarize(HwcU8{s.data(), h, w, 3}, t);
    for (int i = 0; i < n * 3; ++i) EXPECT_EQ(s[i], img[i] >= t ? 255 - img[i] : img[i]);
  }
  // Autocontrast stretches each channel to [0, 255]; a constant channel
  // (here the third) stays.
  auto a = img;
  for (int i = 0; i < n; ++i) {
    a[3 * i] = static_cast<uint8_t>(60 + a[3 * i] / 4);  // 60..123
    a[3 * i + 2] = 77;
  }
  const auto before = a;
  AutoContrast(HwcU8{a.data(), h, w, 3});
  U8Check check;
  for (int ch = 0; ch < 2; ++ch) {
    int lo = 255, hi = 0;
    for (int i = 0; i < n; ++i) {
      lo = std::min<int>(lo, before[3 * i + ch]);
      hi = std::max<int>(hi, before[3 * i + ch]);
    }
    for (int i = 0; i < n; ++i) {
      check.Expect((before[3 * i + ch] - lo) * 255.0 / (hi - lo), a[3 * i + ch], "autocontrast", i);
    }
  }
  check.Done();
  for (int i = 0; i < n; ++i) EXPECT_EQ(a[3 * i + 2], 77);
}

// PIL's ImageOps.equalize loop, per channel: the step from all counts but
// the last value present; lut[v] = (n + step / 2) / step with n the count
// of values below v.
std::vector<uint8_t> PilEqualize(const std::vector<uint8_t>& img, int c) {
  std::vector<uint8_t> out = img;
  const size_t pixels = img.size() / c;
  for (int ch = 0; ch < c; ++ch) {
    std::vector<int64_t> histo(256, 0);
    for (size_t i = 0; i < pixels; ++i) ++histo[img[i * c + ch]];
    std::vector<int64_t> present;
    for (int64_t k : histo) {
      if (k) present.push_back(k);
    }
    int64_t total = 0;
    for (size_t k = 0; k + 1 < present.size(); ++k) total += present[k];
    const int64_t step = total / 255;
    if (!step) continue;
    std::vector<int> lut;
    int64_t acc = step / 2;
    for (int v = 0; v < 256; ++v) {
      lut.push_back(static_cast<int>(std::min<int64_t>(acc / step, 255)));
      acc += histo[v];
    }
    for (size_t i = 0; i < pixels; ++i)
      out[i * c + ch] = static_cast<uint8_t>(lut[img[i * c + ch]]);
  }
  return out;
}

TEST(ImageOpsTest, EqualizeMatchesPilsLoopAndAHandExample) {
  // By hand: 1024 pixels, 512 zeros, 256 of 100, 256 of 200: step (1024 -
  // 256) / 255 = 3; 0 -> 0, 100 -> (512 + 1) / 3 = 171, 200 -> (768 + 1) /
  // 3 = 256 -> 255.
  std::vector<uint8_t> img(1024, 0);
  std::fill(img.begin() + 512, img.begin() + 768, 100);
  std::fill(img.begin() + 768, img.end(), 200);
  auto e = img;
  Equalize(HwcU8{e.data(), 32, 32, 1});
  EXPECT_EQ(e[0], 0);
  EXPECT_EQ(e[600], 171);
  EXPECT_EQ(e[900], 255);
  // Random and skewed images, 3 channels.
  for (uint64_t seed : {7, 8}) {
    auto r = RandomImage(24, 20, 3, seed);
    if (seed == 8) {
      for (auto& v : r) v = static_cast<uint8_t>(v / 3 + 40);
    }
    auto got = r;
    Equalize(HwcU8{got.data(), 24, 20, 3});
    EXPECT_EQ(got, PilEqualize(r, 3));
  }
  // Too few pixels for a step: unchanged.
  auto tiny = RandomImage(4, 4, 3, 9);
  const auto before = tiny;
  Equalize(HwcU8{tiny.data(), 4, 4, 3});
  EXPECT_EQ(tiny, before);
}

// The affine ops' pixel maps in closed form: the source of output (i, j),
// in pixels, before rounding.
struct Source {
  double x, y;
};

// Runs op at magnitude m and compares with map: each output pixel is the
// source pixel nearest to map(i, j) (half to even), or 0 outside; pixels
// within 1e-4 of a rounding tie are skipped.
template <typename Map>
void ExpectAffine(TrivialOp op, double m, int h, int w, Map map) {
  SCOPED_TRACE(std::string(TrivialOpName(op)) + " " + std::to_string(m));
  const auto img = RandomImage(h, w, 3, 10);
  auto got = img;
  ApplyTrivialOp(op, m, HwcU8{got.data(), h, w, 3});
  int compared = 0, skipped = 0;
  for (int i = 0; i < h; ++i) {
    for (int j = 0; j < w; ++j) {
      const Source s = map(i, j);
      auto near_tie = [](double v) { return std::abs(v - std::floor(v) - 0.5) < 1e-4; };
      if (near_tie(s.x) || near_tie(s.y)) {
        ++skipped;
        continue;
      }
      ++compared;
      const double sx = std::nearbyint(s.x), sy = std::nearbyint(s.y);
      for (int ch = 0; ch < 3; ++ch) {
        const int want = sx >= 0 && sx < w && sy >= 0 && sy < h
                             ? img[(static_cast<int>(sy) * w + static_cast<int>(sx)) * 3 + ch]
                             : 0;
        ASSERT_EQ(got[(i * w + j) * 3 + ch], want) << "output (" << i << ", " << j << ")";
      }
    }
  }
  EXPECT_LT(skipped, compared / 20 + 2);
}

TEST(ImageOpsTest, AffineOpsMapPixelsAsTheirClosedForms) {
  for (const auto& [h, w] : {std::pair{8, 8}, std::pair{9, 12}, std::pair{13, 7}}) {
    // Translations move by int(m) pixels (toward zero), zeros coming in.
    for (double m : {0.0, 1.0666667, -3.2, 5.9, -12.0}) {
      const double t = std::trunc(m);
      ExpectAffine(TrivialOp::kTranslateX, m, h, w, [&](int i, int j) {
        return Source{j - t, static_cast<double>(i)};
      });
      ExpectAffine(TrivialOp::kTranslateY, m, h, w, [&](int i, int j) {
        return Source{static_cast<double>(j), i - t};
      });
    }
    // Shears about the top-left corner: x' = x + m y on pixel edges, so the
    // source of column j in row i is j + m (i + 0.5).
    for (double m : {0.033, 0.3, -0.5181, 0.99, -0.99}) {
      ExpectAffine(TrivialOp::kShearX, m, h, w, [&](int i, int j) {
        return Source{j + m * (i + 0.5), static_cast<double>(i)};
      });
      ExpectAffine(TrivialOp::kShearY, m, h, w, [&](int i, int j) {
        return Source{static_cast<double>(j), i + m * (j + 0.5)};
      });
    }
    // Rotation by m degrees counter-clockwise (on screen) about the centre
    // (angles whose sine and cosine put no pixel on a rounding tie; 30 and
    // 45 degree multiples do, and there float32 decides).
    for (double m : {4.5, -33.0, 67.5, -131.0}) {
      const double a = m * M_PI / 180;
      ExpectAffine(TrivialOp::kRotate, m, h, w, [&](int i, int j) {
        const double x = j + 0.5 - w / 2.0, y = i + 0.5 - h / 2.0;
        return Source{std::cos(a) * x - std::sin(a) * y + w / 2.0 - 0.5,
                      std::sin(a) * x + std::cos(a) * y + h / 2.0 - 0.5};
      });
    }
  }
  // 90 degrees on a square image is numpy's rot90 (counter-clockwise).
  const auto img = RandomImage(6, 6, 1, 11);
  auto r = img;
  ApplyTrivialOp(TrivialOp::kRotate, 90, HwcU8{r.data(), 6, 6, 1});
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 6; ++j) EXPECT_EQ(r[i * 6 + j], img[j * 6 + (5 - i)]);
  }
}

TEST(ImageOpsTest, TrivialOpsDispatchWithTorchvisionsFactors) {
  const int h = 6, w = 7;
  const auto img = RandomImage(h, w, 3, 12);
  auto expect_same = [&](TrivialOp op, double m, auto direct) {
    auto a = img, b = img;
    ApplyTrivialOp(op, m, HwcU8{a.data(), h, w, 3});
    direct(HwcU8{b.data(), h, w, 3});
    EXPECT_EQ(a, b) << TrivialOpName(op) << " " << m;
  };
  expect_same(TrivialOp::kIdentity, 0.7, [](HwcU8) {});
  expect_same(TrivialOp::kBrightness, -0.4, [](HwcU8 i) { AdjustBrightness(i, 0.6); });
  expect_same(TrivialOp::kColor, 0.5, [](HwcU8 i) { AdjustSaturation(i, 1.5); });
  expect_same(TrivialOp::kContrast, -0.99, [](HwcU8 i) { AdjustContrast(i, 1 - 0.99); });
  expect_same(TrivialOp::kSharpness, 0.9, [](HwcU8 i) { AdjustSharpness(i, 1.9); });
  expect_same(TrivialOp::kPosterize, 3, [](HwcU8 i) { Posterize(i, 3); });
  expect_same(TrivialOp::kSolarize, 110.5, [](HwcU8 i) { Solarize(i, 110.5); });
  expect_same(TrivialOp::kAutoContrast, 0, [](HwcU8 i) { AutoContrast(i); });
  expect_same(TrivialOp::kEqualize, 0, [](HwcU8 i) { Equalize(i); });
  // Images of 2 or 4 channels are refused.
  std::vector<uint8_t> four(4 * 4 * 4);
  EXPECT_THROW(ApplyTrivialOp(TrivialOp::kBrightness, 0.1, HwcU8{four.data(), 4, 4, 4}), Error);
}

// TrivialAugmentWide's _augmentation_space(31), written out.
TEST(ImageOpsTest, MagnitudeTablesAreTheWideSpace) {
  const char* names[] = {"Identity",  "ShearX",     "ShearY",       "TranslateX", "TranslateY",
                         "Rotate",    "Brightness", "Color",        "Contrast",   "Sharpness",
                         "Posterize", "Solarize",   "AutoContrast", "Equalize"};
  for (int op = 0; op < kTrivialOps; ++op) {
    EXPECT_STREQ(TrivialOpName(static_cast<TrivialOp>(op)), names[op]);
    EXPECT_EQ(TrivialOpSigned(static_cast<TrivialOp>(op)), op >= 1 && op <= 9) << names[op];
  }
  const int posterize[31] = {8, 8, 8, 7, 7, 7, 7, 7, 6, 6, 6, 6, 6, 5, 5, 5,
                             5, 5, 4, 4, 4, 4, 4, 3, 3, 3, 3, 3, 2, 2, 2};
  for (int bin = 0; bin < kTrivialBins; ++bin) {
    auto mag = [&](TrivialOp op) { return TrivialMagnitude(op, bin); };
    for (TrivialOp op : {TrivialOp::kShearX, TrivialOp::kShearY, TrivialOp::kBrightness,
                         TrivialOp::kColor, TrivialOp::kContrast, TrivialOp::kSharpness}) {
      EXPECT_NEAR(mag(op), 0.99 * bin / 30, 1e-7);
    }
    EXPECT_NEAR(mag(TrivialOp::kTranslateX), 32.0 * bin / 30, 2e-6);
    EXPECT_EQ(mag(TrivialOp::kTranslateY), mag(TrivialOp::kTranslateX));
    EXPECT_NEAR(mag(TrivialOp::kRotate), 4.5 * bin, 1e-5);
    EXPECT_EQ(mag(TrivialOp::kPosterize), posterize[bin]);
    EXPECT_EQ(mag(TrivialOp::kSolarize), 255 - 8.5 * bin);
    for (TrivialOp op : {TrivialOp::kIdentity, TrivialOp::kAutoContrast, TrivialOp::kEqualize}) {
      EXPECT_EQ(mag(op), 0);
    }
  }
  // The ends, and the translation's middle bin at 16 pixels (see the header).
  EXPECT_EQ(TrivialMagnitude(TrivialOp::kShearX, 30), static_cast<double>(0.99f));
  EXPECT_EQ(TrivialMagnitude(TrivialOp::kTranslateX, 15), 16.0);
  EXPECT_EQ(TrivialMagnitude(TrivialOp::kTranslateX, 30), 32.0);
  EXPECT_EQ(TrivialMagnitude(TrivialOp::kRotate, 30), 135.0);
  EXPECT_THROW(TrivialMagnitude(TrivialOp::kRotate, 31), Error);
}

}  // namespace
}  // namespace cnnflow
