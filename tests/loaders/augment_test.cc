// Augment: crops, flips, zero and reflect padding and normalisation against
// a naive reference (the padded image built as numpy.pad builds it); the
// alternating flip's epoch rule; TrivialAugmentWide's and ColorJitter's
// draws and their place in the chain (the ops themselves:
// image_ops_test.cc); the image sources' keys and their errors;
// reproducibility per (seed, epoch, sample) whatever the threads.
#include "loaders/augment.h"

#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "loaders/image_decoder.h"
#include "ops/cpu/isa.h"
#include "ops/error.h"
#include "ops/random.h"
#include "ops/schema.h"
#include "ops/shape.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

using testing::RandomImage;

// Per-channel mean and std of CIFAR-10 and of ImageNet.
struct MeanStd {
  std::vector<float> mean, std;
};
const MeanStd kCifar{{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};
const MeanStd kImagenet{{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};
void SetNorm(AugmentOptions* o, const MeanStd& n) {
  o->mean = n.mean;
  o->std = n.std;
}

float Norm(int v, float mean, float std) { return (static_cast<float>(v) / 255.f - mean) / std; }

// The padded image as numpy.pad builds it, [h + 2 pad, w + 2 pad, c]:
// zeros, or for 'reflect' each side's slice of the image reversed without
// its edge (columns pad..1 on the left, w-2..w-1-pad on the right; rows
// likewise, taken from the column-padded rows).
std::vector<uint8_t> Padded(const std::vector<uint8_t>& img, int h, int w, int c, int pad,
                            PadMode mode) {
  const int ph = h + 2 * pad, pw = w + 2 * pad;
  std::vector<uint8_t> out(static_cast<size_t>(ph) * pw * c, 0);
  auto at = [&](int y, int x) { return &out[(static_cast<size_t>(y) * pw + x) * c]; };
  for (int y = 0; y < h; ++y) {
    std::memcpy(at(pad + y, pad), &img[static_cast<size_t>(y) * w * c], static_cast<size_t>(w) * c);
  }
  if (mode == PadMode::kZero) return out;
  for (int y = pad; y < pad + h; ++y) {
    for (int k = 1; k <= pad; ++k) {
      std::memcpy(at(y, pad - k), at(y, pad + k), c);                  // left: image column k
      std::memcpy(at(y, pad + w - 1 + k), at(y, pad + w - 1 - k), c);  // right: column w-1-k
    }
  }
  for (int k = 1; k <= pad; ++k) {
    std::memcpy(at(pad - k, 0), at(pad + k, 0), static_cast<size_t>(pw) * c);
    std::memcpy(at(pad + h - 1 + k, 0), at(pad + h - 1 - k, 0), static_cast<size_t>(pw) * c);
  }
  return out;
}

// Plain loops over the padded image (zero beyond it), no resize:
// [c, out_h, out_w].
std::vector<float> Reference(const std::vector<uint8_t>& img, int h, int w, int c,
                             const AugmentOptions& o, const AugmentParams& p) {
  const std::vector<uint8_t> padded = Padded(img, h, w, c, o.pad, o.pad_mode);
  const int ph = h + 2 * o.pad, pw = w + 2 * o.pad;
  std::vector<float> out(static_cast<size_t>(c) * o.out_h * o.out_w);
  for (int ch = 0; ch < c; ++ch) {
    const float mean = o.mean.empty() ? 0.f : o.mean[o.mean.size() == 1 ? 0 : ch];
    const float std = o.std.empty() ? 1.f : o.std[o.std.size() == 1 ? 0 : ch];
    for (int y = 0; y < o.out_h; ++y) {
      for (int x = 0; x < o.out_w; ++x) {
        const int xx = p.flip ? o.out_w - 1 - x : x;
        const int iy = p.top + y, ix = p.left + xx;  // padded-image coords
        int v = 0;
        if (iy >= 0 && iy < ph && ix >= 0 && ix < pw) v = padded[(iy * pw + ix) * c + ch];
        out[(ch * o.out_h + y) * o.out_w + x] = Norm(v, mean, std);
      }
    }
  }
  return out;
}

std::vector<float> RunAugment(const std::vector<uint8_t>& img, int h, int w, int c,
                              const AugmentOptions& o, uint64_t seed, int64_t epoch,
                              int64_t index) {
  std::vector<float> out(static_cast<size_t>(c) * o.out_h * o.out_w, -1e9f);
  Augment(img.data(), h, w, c, o, seed, epoch, index, out.data());
  return out;
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// [c, h, w] mirrored left-right.
std::vector<float> Mirrored(const std::vector<float>& chw, int c, int h, int w) {
  std::vector<float> out(chw.size());
  for (int r = 0; r < c * h; ++r) {
    for (int x = 0; x < w; ++x) out[r * w + x] = chw[r * w + (w - 1 - x)];
  }
  return out;
}

// {top, left, h, w}: an erased rectangle (none when h or w is 0) or a
// resized crop's region.
using Rect = std::array<int, 4>;

// torchvision.transforms.RandomErasing's choice (get_params and the p
// draw), transcribed with its own generator: the reference for the
// statistics of ours. Returns {top, left, h, w}, h == 0 when nothing is
// erased.
Rect TorchvisionErase(int img_h, int img_w, double p, std::array<double, 2> scale,
                      std::array<double, 2> ratio, std::mt19937_64* g, int attempts = 10) {
  std::uniform_real_distribution<double> u(0, 1);
  if (!(u(*g) < p)) return {0, 0, 0, 0};
  const double area = img_h * img_w;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    const double erase_area = area * std::uniform_real_distribution<double>(scale[0], scale[1])(*g);
    const double aspect = std::exp(
        std::uniform_real_distribution<double>(std::log(ratio[0]), std::log(ratio[1]))(*g));
    const int h = static_cast<int>(std::lround(std::sqrt(erase_area * aspect)));
    const int w = static_cast<int>(std::lround(std::sqrt(erase_area / aspect)));
    if (!(h < img_h && w < img_w)) continue;
    const int i = std::uniform_int_distribution<int>(0, img_h - h)(*g);
    const int j = std::uniform_int_distribution<int>(0, img_w - w)(*g);
    return {i, j, h, w};
  }
  return {0, 0, 0, 0};
}

// RandomResizedCrop's fallback when no try fits: the central crop, cut to
// the ratio's range.
Rect TorchvisionCentreCrop(int img_h, int img_w, std::array<double, 2> ratio) {
  const double in_ratio = static_cast<double>(img_w) / img_h;
  int w = img_w, h = img_h;
  if (in_ratio < std::min(ratio[0], ratio[1])) {
    h = static_cast<int>(std::lround(w / std::min(ratio[0], ratio[1])));
  } else if (in_ratio > std::max(ratio[0], ratio[1])) {
    w = static_cast<int>(std::lround(h * std::max(ratio[0], ratio[1])));
  }
  return {(img_h - h) / 2, (img_w - w) / 2, h, w};
}

// torchvision.transforms.RandomResizedCrop.get_params, transcribed with its
// own generator: {top, left, h, w} of the region of an img_h x img_w image.
Rect TorchvisionResizedCrop(int img_h, int img_w, std::array<double, 2> scale,
                            std::array<double, 2> ratio, std::mt19937_64* g) {
  const double area = img_h * img_w;
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * std::uniform_real_distribution<double>(scale[0], scale[1])(*g);
    const double aspect = std::exp(
        std::uniform_real_distribution<double>(std::log(ratio[0]), std::log(ratio[1]))(*g));
    const int w = static_cast<int>(std::lround(std::sqrt(target * aspect)));
    const int h = static_cast<int>(std::lround(std::sqrt(target / aspect)));
    if (0 < w && w <= img_w && 0 < h && h <= img_h) {
      const int i = std::uniform_int_distribution<int>(0, img_h - h)(*g);
      const int j = std::uniform_int_distribution<int>(0, img_w - w)(*g);
      return {i, j, h, w};
    }
  }
  return TorchvisionCentreCrop(img_h, img_w, ratio);
}

// Statistics of a set of rectangles in an out_h x out_w frame.
struct RectStats {
  double some = 0;               // fraction of draws with a rectangle (h, w > 0)
  double area = 0;               // mean area fraction, over the rectangles
  double area_sq = 0;            // mean squared area fraction, over the rectangles
  double h = 0, w = 0;           // mean sides, over the rectangles
  double centre_y = 0;           // mean centre row / out_h, over the rectangles
  std::array<double, 5> bins{};  // area fraction histogram [0, 0.1, ..., 0.4+)
};

RectStats Stats(const std::vector<Rect>& rects, int out_h, int out_w) {
  RectStats s;
  int n = 0;
  for (const auto& [top, left, h, w] : rects) {
    EXPECT_TRUE(top >= 0 && left >= 0 && top + h <= out_h && left + w <= out_w)
        << top << ", " << left << ", " << h << ", " << w;
    if (h == 0 || w == 0) continue;
    ++n;
    const double a = static_cast<double>(h) * w / (out_h * out_w);
    s.area += a;
    s.area_sq += a * a;
    s.h += h;
    s.w += w;
    s.centre_y += (top + h / 2.0) / out_h;
    s.bins[std::min(4, static_cast<int>(a * 10))] += 1;
  }
  s.some = static_cast<double>(n) / rects.size();
  for (double* v : {&s.area, &s.area_sq, &s.h, &s.w, &s.centre_y}) *v /= std::max(n, 1);
  for (double& b : s.bins) b /= std::max(n, 1);
  return s;
}

// Our draws against the reference's (many more), in an out_h x out_w frame:
// the fraction with a rectangle, the mean area and its histogram within 5
// standard errors of our count; mean sides within 4%, the mean centre row
// within 1.5% of the frame.
void ExpectSameStatistics(const std::vector<Rect>& ours, const std::vector<Rect>& theirs, int out_h,
                          int out_w) {
  const RectStats a = Stats(ours, out_h, out_w), b = Stats(theirs, out_h, out_w);
  const double n = static_cast<double>(ours.size()), n_some = b.some * n;
  EXPECT_NEAR(a.some, b.some, 5 * std::sqrt(b.some * (1 - b.some) / n) + 1e-3);
  const double se_area = std::sqrt(std::max(0.0, b.area_sq - b.area * b.area) / n_some);
  EXPECT_NEAR(a.area, b.area, 5 * se_area + 1e-3);
  EXPECT_NEAR(a.h, b.h, 0.04 * b.h + 0.02);
  EXPECT_NEAR(a.w, b.w, 0.04 * b.w + 0.02);
  EXPECT_NEAR(a.centre_y, b.centre_y, 0.015);
  for (int bin = 0; bin < 5; ++bin) {
    const double se = std::sqrt(b.bins[bin] * (1 - b.bins[bin]) / n_some);
    EXPECT_NEAR(a.bins[bin], b.bins[bin], 5 * se + 1e-3) << "area bin " << bin;
  }
}

// f(i) for i in [0, n).
template <typename F>
std::vector<Rect> Draws(int n, F f) {
  std::vector<Rect> v;
  for (int i = 0; i < n; ++i) v.push_back(f(i));
  return v;
}

TEST(AugmentTest, CenterCropMatchesHandComputedValues) {
  // 4x5 gray image, v = 10 y + x; a 2x3 centre crop starts at (1, 1).
  std::vector<uint8_t> img(20);
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 5; ++x) img[y * 5 + x] = static_cast<uint8_t>(10 * y + x);
  }
  AugmentOptions o;
  o.out_h = 2;
  o.out_w = 3;
  const std::vector<float> out = RunAugment(img, 4, 5, 1, o, 1, 0, 0);
  const std::vector<float> want = {11 / 255.f, 12 / 255.f, 13 / 255.f,
                                   21 / 255.f, 22 / 255.f, 23 / 255.f};
  EXPECT_TRUE(BitwiseEqual(out, want));

  // Centre offsets round half to even, as torchvision's CenterCrop.
  auto top = [&](int h, int out_h) {
    o.out_h = out_h;
    return DrawAugmentParams(h, 8, o, 0, 0, 0).top;
  };
  EXPECT_EQ(top(5, 2), 2);  // (5 - 2) / 2 = 1.5 -> 2
  EXPECT_EQ(top(7, 2), 2);  // 2.5 -> 2
  EXPECT_EQ(top(6, 2), 2);
  EXPECT_EQ(top(2, 2), 0);
}

TEST(AugmentTest, RgbCropWithNormalisationMatchesReference) {
  const int h = 9, w = 11, c = 3;
  const auto img = RandomImage(h, w, c, 3);
  AugmentOptions o;
  o.out_h = 5;
  o.out_w = 6;
  SetNorm(&o, kImagenet);
  for (bool random : {false, true}) {
    o.random_crop = random;
    for (int64_t i = 0; i < 20; ++i) {
      const AugmentParams p = DrawAugmentParams(h, w, o, 5, 1, i);
      EXPECT_TRUE(
          BitwiseEqual(RunAugment(img, h, w, c, o, 5, 1, i), Reference(img, h, w, c, o, p)));
    }
  }
}

// Rows long enough for the vector path (16 pixels at a time, the rest by
// table), for every ISA this CPU has: bitwise the naive reference, for gray,
// RGB and the generic channel count, flipped or not, padded, cropped at
// every offset, with one or per-channel mean/std.
TEST(AugmentTest, EveryIsaMatchesReferenceOnWideRows) {
  const cpu::Isa cpu_isa = cpu::CpuIsa();
  for (cpu::Isa isa = cpu::Isa::kScalar; isa <= cpu_isa;
       isa = static_cast<cpu::Isa>(static_cast<int>(isa) + 1)) {
    SCOPED_TRACE(cpu::IsaName(isa));
    cpu::SetMaxIsa(isa);
    for (int c : {1, 3, 4}) {
      for (int w : {16, 17, 37, 70}) {
        SCOPED_TRACE(::testing::Message() << "c " << c << ", w " << w);
        const int h = 5;
        const auto img = RandomImage(h, w, c, 11 + w);
        AugmentOptions o;
        o.out_h = 4;
        o.out_w = w - 2;
        o.pad = 3;
        if (c == 3) {
          SetNorm(&o, kCifar);
        } else {
          o.mean = {0.5f};
          o.std = {0.25f};
        }
        Augmenter aug(o);
        std::vector<float> out(static_cast<size_t>(c) * o.out_h * o.out_w);
        for (int left = 0; left <= w + 2 * o.pad - o.out_w; ++left) {
          for (bool flip : {false, true}) {
            const AugmentParams p{1, left, flip};
            aug.RunWithParams(img.data(), h, w, c, p, out.data());
            ASSERT_TRUE(BitwiseEqual(out, Reference(img, h, w, c, o, p)))
                << "left " << left << (flip ? ", flipped" : "");
          }
        }
      }
    }
  }
  cpu::SetMaxIsa(cpu_isa);
}

TEST(AugmentTest, FlipMirrorsTheCrop) {
  const int h = 6, w = 7, c = 3;
  const auto img = RandomImage(h, w, c, 4);
  AugmentOptions o;
  o.out_h = 4;
  o.out_w = 5;
  o.pad = 1;
  Augmenter aug(o);
  for (const AugmentParams& base :
       {AugmentParams{0, 0, false}, AugmentParams{2, 3, false}, AugmentParams{1, 1, false}}) {
    AugmentParams flipped = base;
    flipped.flip = true;
    std::vector<float> a(c * 20), b(c * 20);
    aug.RunWithParams(img.data(), h, w, c, base, a.data());
    aug.RunWithParams(img.data(), h, w, c, flipped, b.data());
    EXPECT_TRUE(BitwiseEqual(b, Mirrored(a, c, 4, 5)));
    EXPECT_TRUE(BitwiseEqual(b, Reference(img, h, w, c, o, flipped)));
  }
  // hflip draws a flip about half the time, and the output follows it.
  o.hflip = true;
  int flips = 0;
  for (int64_t i = 0; i < 200; ++i) {
    const AugmentParams p = DrawAugmentParams(h, w, o, 9, 0, i);
    flips += p.flip;
    if (i < 20) {
      EXPECT_TRUE(
          BitwiseEqual(RunAugment(img, h, w, c, o, 9, 0, i), Reference(img, h, w, c, o, p)));
    }
  }
  EXPECT_GT(flips, 60);
  EXPECT_LT(flips, 140);
}

TEST(AugmentTest, PaddedRandomCropStaysInRangeAndPadsWithZero) {
  // CIFAR: RandomCrop(32, padding=4) + flip + Normalize.
  const int h = 32, w = 32, c = 3;
  const auto img = RandomImage(h, w, c, 5);
  AugmentOptions o;
  o.out_h = o.out_w = 32;
  o.pad = 4;
  o.random_crop = true;
  o.hflip = true;
  SetNorm(&o, kCifar);
  std::set<int> tops, lefts;
  for (int64_t i = 0; i < 400; ++i) {
    const AugmentParams p = DrawAugmentParams(h, w, o, 11, 2, i);
    ASSERT_GE(p.top, 0);
    ASSERT_LE(p.top, 8);
    ASSERT_GE(p.left, 0);
    ASSERT_LE(p.left, 8);
    tops.insert(p.top);
    lefts.insert(p.left);
    if (i < 30) {
      const auto out = RunAugment(img, h, w, c, o, 11, 2, i);
      ASSERT_TRUE(BitwiseEqual(out, Reference(img, h, w, c, o, p))) << "sample " << i;
      // Rows above the image (top < pad) hold exactly (0 - mean) / std.
      for (int ch = 0; ch < c; ++ch) {
        for (int y = 0; y < o.pad - p.top; ++y) {
          for (int x = 0; x < 32; ++x) {
            ASSERT_EQ(out[(ch * 32 + y) * 32 + x], (0.f - o.mean[ch]) / o.std[ch]);
          }
        }
      }
    }
  }
  EXPECT_EQ(tops.size(), 9u);  // every offset 0..8 occurs
  EXPECT_EQ(lefts.size(), 9u);
  // Fixed extreme offsets: the padding lands on the expected side.
  Augmenter aug(o);
  std::vector<float> out(c * 32 * 32);
  aug.RunWithParams(img.data(), h, w, c, {0, 8, false}, out.data());
  const float zero0 = (0.f - o.mean[0]) / o.std[0];
  EXPECT_EQ(out[0], zero0);  // top-left: padded row
  EXPECT_EQ(out[4 * 32 + 27], Norm(img[(0 * 32 + 31) * 3], o.mean[0], o.std[0]));
  EXPECT_EQ(out[4 * 32 + 28], zero0);  // right padding
  EXPECT_EQ(out[31 * 32 + 0], Norm(img[(27 * 32 + 4) * 3], o.mean[0], o.std[0]));
}

TEST(AugmentTest, CropLargerThanImageIsCentredAndZeroFilled) {
  const auto img = RandomImage(3, 3, 1, 6);
  AugmentOptions o;
  o.out_h = 6;
  o.out_w = 5;
  o.random_crop = true;  // no room to move: centred anyway
  const AugmentParams p = DrawAugmentParams(3, 3, o, 1, 0, 0);
  EXPECT_EQ(p.top, -1);  // 3 extra rows: 1 above, 2 below
  EXPECT_EQ(p.left, -1);
  const auto out = RunAugment(img, 3, 3, 1, o, 1, 0, 0);
  EXPECT_TRUE(BitwiseEqual(out, Reference(img, 3, 3, 1, o, p)));
  EXPECT_EQ(out[1 * 5 + 1], img[0] / 255.f);
  EXPECT_EQ(out[0], 0.f);
}

TEST(AugmentTest, NormalisationValuesAreExact) {
  // Every byte value in each of 3 channels.
  std::vector<uint8_t> img(256 * 3);
  for (int v = 0; v < 256; ++v) {
    for (int ch = 0; ch < 3; ++ch) img[v * 3 + ch] = static_cast<uint8_t>((v + 85 * ch) % 256);
  }
  AugmentOptions o;
  o.out_h = 16;
  o.out_w = 16;
  SetNorm(&o, kImagenet);
  auto out = RunAugment(img, 16, 16, 3, o, 0, 0, 0);
  for (int ch = 0; ch < 3; ++ch) {
    for (int i = 0; i < 256; ++i) {
      ASSERT_EQ(out[ch * 256 + i],
                (static_cast<float>(img[i * 3 + ch]) / 255.f - o.mean[ch]) / o.std[ch]);
    }
  }
  EXPECT_FLOAT_EQ(out[255], (1.f - 0.485f) / 0.229f);  // v = 255 in channel 0
  // One value for all channels; none = plain v / 255.
  o.mean = {0.5f};
  o.std = {0.25f};
  out = RunAugment(img, 16, 16, 3, o, 0, 0, 0);
  for (int ch = 0; ch < 3; ++ch) {
    for (int i = 0; i < 256; ++i) {
      ASSERT_EQ(out[ch * 256 + i], (img[i * 3 + ch] / 255.f - 0.5f) / 0.25f);
    }
  }
  o.mean.clear();
  o.std.clear();
  out = RunAugment(img, 16, 16, 3, o, 0, 0, 0);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(out[256 + i], img[i * 3 + 1] / 255.f);
}

TEST(AugmentTest, ResizeThenCrop) {
  EXPECT_EQ(ResizedSize(375, 500, 256).h, 256);
  EXPECT_EQ(ResizedSize(375, 500, 256).w, 341);
  EXPECT_EQ(ResizedSize(500, 375, 256).h, 341);
  EXPECT_EQ(ResizedSize(500, 375, 256).w, 256);
  EXPECT_EQ(ResizedSize(10, 20, 0).w, 20);
  const int h = 40, w = 60, c = 3;
  const auto img = RandomImage(h, w, c, 8);
  AugmentOptions o;
  o.out_h = o.out_w = 20;
  o.resize_min_side = 20;
  const auto out = RunAugment(img, h, w, c, o, 0, 0, 0);
  // Reference: OpenCV resize to 20x30 (the plumbing is what is under test),
  // then a naive centre crop at (0, 5).
  cv::Mat src(h, w, CV_8UC3, const_cast<uint8_t*>(img.data())), dst;
  cv::resize(src, dst, cv::Size(30, 20), 0, 0, cv::INTER_LINEAR);
  std::vector<uint8_t> small(dst.data, dst.data + 20 * 30 * 3);
  EXPECT_TRUE(BitwiseEqual(out, Reference(small, 20, 30, c, o, AugmentParams{0, 5, false})));
}

TEST(AugmentTest, SameKeySameResultDifferentEpochDifferentCrop) {
  const int h = 32, w = 32, c = 3;
  const auto img = RandomImage(h, w, c, 9);
  AugmentOptions o;
  o.out_h = o.out_w = 28;
  o.pad = 2;
  o.random_crop = true;
  o.hflip = true;
  int differ_epoch = 0, differ_seed = 0;
  for (int64_t i = 0; i < 20; ++i) {
    const auto a = RunAugment(img, h, w, c, o, 42, 3, i);
    EXPECT_TRUE(BitwiseEqual(a, RunAugment(img, h, w, c, o, 42, 3, i)));
    differ_epoch += !BitwiseEqual(a, RunAugment(img, h, w, c, o, 42, 4, i));
    differ_seed += !BitwiseEqual(a, RunAugment(img, h, w, c, o, 43, 3, i));
  }
  EXPECT_GE(differ_epoch, 15);  // 2 x 9 x 9 = 162 outcomes: a few collide
  EXPECT_GE(differ_seed, 15);
}

TEST(AugmentTest, ReflectPaddingMirrorsWithoutRepeatingTheEdge) {
  // numpy.pad(np.arange(1, 10).reshape(3, 3), 2, 'reflect'), by hand: each row reads
  // 3 2 [1 2 3] 2 1 and the rows run 3 2 [1 2 3] 2 1 the same way.
  const std::vector<uint8_t> img = {1, 2, 3, 4, 5, 6, 7, 8, 9};  // rows 1 2 3 / 4 5 6 / 7 8 9
  AugmentOptions o;
  o.out_h = 7;
  o.out_w = 7;
  o.pad = 2;
  o.pad_mode = PadMode::kReflect;
  Augmenter aug(o);
  std::vector<float> out(49);
  aug.RunWithParams(img.data(), 3, 3, 1, {0, 0, false}, out.data());
  const int want[7][7] = {{9, 8, 7, 8, 9, 8, 7}, {6, 5, 4, 5, 6, 5, 4}, {3, 2, 1, 2, 3, 2, 1},
                          {6, 5, 4, 5, 6, 5, 4}, {9, 8, 7, 8, 9, 8, 7}, {6, 5, 4, 5, 6, 5, 4},
                          {3, 2, 1, 2, 3, 2, 1}};
  for (int y = 0; y < 7; ++y) {
    for (int x = 0; x < 7; ++x) ASSERT_EQ(out[y * 7 + x], want[y][x] / 255.f) << y << ", " << x;
  }
  // The same image zero-padded: the border is 0, the image in the middle.
  o.pad_mode = PadMode::kZero;
  Augmenter(o).RunWithParams(img.data(), 3, 3, 1, {0, 0, false}, out.data());
  for (int y = 0; y < 7; ++y) {
    for (int x = 0; x < 7; ++x) {
      const bool in = y >= 2 && y < 5 && x >= 2 && x < 5;
      ASSERT_EQ(out[y * 7 + x], in ? img[(y - 2) * 3 + x - 2] / 255.f : 0.f) << y << ", " << x;
    }
  }
}

// Reflect and zero padding against the numpy-style padded image, for every
// ISA this CPU has: odd sizes, 1, 3 and 4 channels, rows short and long
// enough for the vector path, flipped or not, at every crop offset (and one
// beyond the padding each way, zero-filled there); the last case's 3-wide
// crop fits inside the 4-wide padding, so some rows read no image column.
TEST(AugmentTest, ReflectPaddingMatchesNumpyAtEveryOffset) {
  const cpu::Isa cpu_isa = cpu::CpuIsa();
  for (cpu::Isa isa = cpu::Isa::kScalar; isa <= cpu_isa;
       isa = static_cast<cpu::Isa>(static_cast<int>(isa) + 1)) {
    cpu::SetMaxIsa(isa);
    for (const PadMode mode : {PadMode::kZero, PadMode::kReflect}) {
      for (int c : {1, 3, 4}) {
        for (const auto& [h, w, pad, out_h, out_w] :
             std::vector<std::array<int, 5>>{{5, 7, 2, 5, 7},
                                             {5, 7, 4, 3, 9},
                                             {7, 5, 1, 7, 5},
                                             {3, 37, 2, 3, 35},
                                             {9, 33, 4, 9, 33},
                                             {7, 5, 4, 3, 3}}) {
          SCOPED_TRACE(::testing::Message()
                       << cpu::IsaName(isa) << (mode == PadMode::kReflect ? " reflect" : " zero")
                       << ", c " << c << ", " << h << "x" << w << ", pad " << pad << ", out "
                       << out_h << "x" << out_w);
          const auto img = RandomImage(h, w, c, 31 * h + w + c);
          AugmentOptions o;
          o.out_h = out_h;
          o.out_w = out_w;
          o.pad = pad;
          o.pad_mode = mode;
          if (c == 3) {
            SetNorm(&o, kCifar);
          }
          const Augmenter aug(o);
          std::vector<float> out(static_cast<size_t>(c) * out_h * out_w);
          for (int top = -1; top <= h + 2 * pad - out_h + 1; ++top) {
            for (int left = -1; left <= w + 2 * pad - out_w + 1; ++left) {
              for (bool flip : {false, true}) {
                const AugmentParams p{top, left, flip};
                aug.RunWithParams(img.data(), h, w, c, p, out.data());
                ASSERT_TRUE(BitwiseEqual(out, Reference(img, h, w, c, o, p)))
                    << "top " << top << ", left " << left << (flip ? ", flipped" : "");
              }
            }
          }
          // And through the draw: random crops land on the same values.
          o.random_crop = o.hflip = true;
          for (int64_t i = 0; i < 10; ++i) {
            const AugmentParams p = DrawAugmentParams(h, w, o, 3, 1, i);
            ASSERT_TRUE(
                BitwiseEqual(RunAugment(img, h, w, c, o, 3, 1, i), Reference(img, h, w, c, o, p)));
          }
        }
      }
    }
  }
  cpu::SetMaxIsa(cpu_isa);
}

TEST(AugmentTest, ZeroPaddingIsTheDefaultAndUnchanged) {
  // The default pad_mode is zero, and the padding holds (0 - mean) / std.
  EXPECT_EQ(AugmentOptions{}.pad_mode, PadMode::kZero);
  const auto img = RandomImage(6, 6, 3, 12);
  AugmentOptions o;
  o.out_h = o.out_w = 6;
  o.pad = 2;
  o.mean = {0.5f};
  o.std = {0.25f};
  std::vector<float> out(3 * 36);
  Augmenter(o).RunWithParams(img.data(), 6, 6, 3, {0, 0, false}, out.data());
  for (int ch = 0; ch < 3; ++ch) {
    for (int x = 0; x < 6; ++x) ASSERT_EQ(out[ch * 36 + x], (0.f - 0.5f) / 0.25f);  // row -2
    ASSERT_EQ(out[ch * 36 + 2 * 6 + 2], Norm(img[ch], 0.5f, 0.25f));                // pixel (0, 0)
  }
}

TEST(AugmentTest, ReflectNeedsPadSmallerThanTheImage) {
  AugmentOptions o;
  o.out_h = o.out_w = 4;
  o.pad = 4;
  o.pad_mode = PadMode::kReflect;
  const Augmenter aug(o);
  const auto img = RandomImage(4, 9, 1, 1);
  std::vector<float> out(16);
  // pad 4 on a 4-row image: no row 4 to mirror row -4 to.
  const std::string e = testing::ErrorOf<ConfigError>([&] {
    aug.RunWithParams(img.data(), 4, 9, 1, {0, 0, false}, out.data());
  });
  testing::ExpectContains(e, {"pad_mode: reflect", "pad 4", "4x9"});
  const auto big = RandomImage(5, 5, 1, 1);
  aug.RunWithParams(big.data(), 5, 5, 1, {0, 0, false}, out.data());  // pad 4 < 5: fine
  // Zero padding has no such limit.
  o.pad_mode = PadMode::kZero;
  Augmenter(o).RunWithParams(img.data(), 4, 9, 1, {0, 0, false}, out.data());
  // With a resize the short side is known up front.
  o.pad_mode = PadMode::kReflect;
  o.resize_min_side = 4;
  testing::ExpectContains(testing::ErrorOf<ConfigError>([&] { Augmenter{o}; }),
                          {"pad_mode: reflect", "pad 4", "resize_min_side 4"});
}

TEST(AugmentTest, AlternateFlipFlipsEachSampleEveryOtherEpoch) {
  AugmentOptions o;
  o.out_h = o.out_w = 8;
  o.pad = 2;
  o.random_crop = true;
  o.hflip = true;
  o.alternate_flip = true;
  AugmentOptions random = o;
  random.alternate_flip = false;
  const int n = 2000;
  for (int64_t e = 0; e < 6; ++e) {
    int flipped = 0, crops_differ = 0;
    for (int64_t i = 0; i < n; ++i) {
      const AugmentParams a = DrawAugmentParams(8, 8, o, 17, e, i);
      const AugmentParams b = DrawAugmentParams(8, 8, o, 17, e + 1, i);
      const AugmentParams c = DrawAugmentParams(8, 8, o, 17, e + 2, i);
      ASSERT_NE(a.flip, b.flip) << "epoch " << e << ", sample " << i;
      ASSERT_EQ(a.flip, c.flip) << "epoch " << e << ", sample " << i;
      flipped += a.flip;
      // The crop is still drawn per epoch.
      crops_differ += a.top != c.top || a.left != c.left;
      // Epoch 0 is the random flip's own draw; the seed matters.
      if (e == 0) {
        ASSERT_EQ(a.flip, DrawAugmentParams(8, 8, random, 17, 0, i).flip);
      }
    }
    EXPECT_GT(flipped, n / 2 - 150) << "epoch " << e;  // ~7 sigma
    EXPECT_LT(flipped, n / 2 + 150) << "epoch " << e;
    EXPECT_GT(crops_differ, n / 2) << "epoch " << e;
  }
  int seed_differs = 0;
  for (int64_t i = 0; i < 200; ++i) {
    seed_differs +=
        DrawAugmentParams(8, 8, o, 17, 0, i).flip != DrawAugmentParams(8, 8, o, 18, 0, i).flip;
  }
  EXPECT_GT(seed_differs, 50);
  // Without hflip, alternate_flip flips nothing.
  o.hflip = false;
  for (int64_t e = 0; e < 2; ++e) EXPECT_FALSE(DrawAugmentParams(8, 8, o, 17, e, 3).flip);
}

TEST(AugmentTest, AlternateFlipOutputIsTheMirrorNextEpoch) {
  // Centre crop, no padding: epoch 1's sample is epoch 0's mirrored.
  const int h = 6, w = 9, c = 3;
  const auto img = RandomImage(h, w, c, 21);
  AugmentOptions o;
  o.out_h = 6;
  o.out_w = 9;
  o.hflip = true;
  o.alternate_flip = true;
  for (int64_t i = 0; i < 8; ++i) {
    const auto e0 = RunAugment(img, h, w, c, o, 5, 0, i);
    const auto e1 = RunAugment(img, h, w, c, o, 5, 1, i);
    const auto e2 = RunAugment(img, h, w, c, o, 5, 2, i);
    EXPECT_TRUE(BitwiseEqual(e0, e2));
    EXPECT_TRUE(BitwiseEqual(e1, Mirrored(e0, c, h, w)));
  }
}

// RandomErasing's draw against torchvision's algorithm run with its own
// generator: how often a rectangle is erased (p times the chance that one of
// 10 tries fits), its area distribution, sides and position; on CIFAR's
// 32x32 with the defaults, and on a 3x3 output where most tries do not fit
// (so one try instead of 10 would show), and with tall rectangles only
// (ratio [1, 3]: h and w swapped would show).
TEST(AugmentTest, RandomErasingMatchesTorchvisionsStatistics) {
  struct Case {
    int out;
    double p;
    std::array<double, 2> scale, ratio;
  };
  for (const Case& k :
       {Case{32, 0.5, {0.02, 0.33}, {0.3, 3.3}}, Case{3, 1.0, {0.5, 1.0}, {0.3, 3.3}},
        Case{24, 0.8, {0.1, 0.4}, {1.0, 3.0}}}) {
    SCOPED_TRACE(::testing::Message() << "out " << k.out << ", p " << k.p);
    AugmentOptions o;
    o.out_h = o.out_w = k.out;
    o.erase_p = k.p;
    o.erase_scale = k.scale;
    o.erase_ratio = k.ratio;
    std::mt19937_64 g(5);
    ExpectSameStatistics(
        Draws(20000,
              [&](int i) {
                const AugmentParams p = DrawAugmentParams(k.out, k.out, o, 23, i % 3, i);
                return Rect{p.erase_top, p.erase_left, p.erase_h, p.erase_w};
              }),
        Draws(200000,
              [&](int) { return TorchvisionErase(k.out, k.out, k.p, k.scale, k.ratio, &g); }),
        k.out, k.out);
  }
  // The 3x3 case really needs the 10 tries: one try alone fits far less
  // often than the ~65% drawn above.
  std::mt19937_64 g(7);
  int fits_once = 0;
  for (int i = 0; i < 20000; ++i) {
    fits_once += TorchvisionErase(3, 3, 1.0, {0.5, 1.0}, {0.3, 3.3}, &g, 1)[2] > 0;
  }
  AugmentOptions o;
  o.out_h = o.out_w = 3;
  o.erase_p = 1;
  o.erase_scale = {0.5, 1.0};
  int ours = 0;
  for (int64_t i = 0; i < 2000; ++i) ours += DrawAugmentParams(3, 3, o, 1, 0, i).erase_h > 0;
  EXPECT_GT(ours / 2000.0, 2 * fits_once / 20000.0);
}

TEST(AugmentTest, RandomErasingZeroesTheRectangleInEveryChannel) {
  const int h = 8, w = 10, c = 3;
  const auto img = RandomImage(h, w, c, 50);
  AugmentOptions o;
  o.out_h = 8;
  o.out_w = 10;
  SetNorm(&o, kCifar);
  const Augmenter aug(o);
  AugmentParams p{0, 0, true};
  std::vector<float> plain(c * h * w), erased(c * h * w);
  aug.RunWithParams(img.data(), h, w, c, p, plain.data());
  p.erase_top = 2;
  p.erase_left = 5;
  p.erase_h = 3;
  p.erase_w = 4;
  aug.RunWithParams(img.data(), h, w, c, p, erased.data());
  for (int ch = 0; ch < c; ++ch) {
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        const int i = (ch * h + y) * w + x;
        const bool in = y >= 2 && y < 5 && x >= 5 && x < 9;
        ASSERT_EQ(erased[i], in ? 0.f : plain[i]) << ch << ", " << y << ", " << x;
      }
    }
  }
  // Off by default; drawn per (seed, epoch, sample) when on, and applied.
  EXPECT_EQ(AugmentOptions{}.erase_p, 0);
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(DrawAugmentParams(h, w, o, 3, 0, i).erase_h, 0);
  o.erase_p = 1;
  int differ = 0;
  for (int64_t i = 0; i < 50; ++i) {
    const AugmentParams a = DrawAugmentParams(h, w, o, 3, 0, i);
    const AugmentParams b = DrawAugmentParams(h, w, o, 3, 1, i);
    differ += a.erase_top != b.erase_top || a.erase_left != b.erase_left || a.erase_h != b.erase_h;
    std::vector<float> want(c * h * w);
    Augmenter(o).RunWithParams(img.data(), h, w, c, a, want.data());
    EXPECT_TRUE(BitwiseEqual(RunAugment(img, h, w, c, o, 3, 0, i), want));
  }
  EXPECT_GT(differ, 25);
  // Bad values name the key.
  o.erase_p = 1.5;
  testing::ExpectContains(testing::ErrorOf<ConfigError>([&] { Augmenter{o}; }), {"erase", "1.5"});
  o.erase_p = 0.5;
  o.erase_scale = {0.4, 0.2};
  testing::ExpectContains(testing::ErrorOf<ConfigError>([&] { Augmenter{o}; }), {"erase_scale"});
  o.erase_scale = {0.02, 0.33};
  o.erase_ratio = {0, 3};
  testing::ExpectContains(testing::ErrorOf<ConfigError>([&] { Augmenter{o}; }), {"erase_ratio"});
}

// RandomResizedCrop's draw against torchvision's algorithm run with its own
// generator: region area and sides, position, area histogram, and how often
// it is the fallback centre crop; on a 40x60 image with the defaults, a
// 10x100 one (wider than any allowed ratio: always the fallback, cut to
// ratio 4/3), a 30x30 one with scale [0.9, 1] (tries often too wide or too
// tall: the whole image), and tall-only ratios on 30x20 (w and h swapped
// would show).
TEST(AugmentTest, RandomResizedCropMatchesTorchvisionsStatistics) {
  struct Case {
    int h, w;
    std::array<double, 2> scale, ratio;
  };
  for (const Case& k :
       {Case{40, 60, {0.08, 1.0}, {0.75, 4.0 / 3.0}}, Case{10, 100, {0.08, 1.0}, {0.75, 4.0 / 3.0}},
        Case{30, 30, {0.9, 1.0}, {0.75, 4.0 / 3.0}}, Case{30, 20, {0.2, 0.5}, {0.3, 0.7}}}) {
    SCOPED_TRACE(::testing::Message() << k.h << "x" << k.w << ", scale " << k.scale[0]);
    AugmentOptions o;
    o.out_h = o.out_w = 16;
    o.random_resized_crop = true;
    o.crop_scale = k.scale;
    o.crop_ratio = k.ratio;
    std::mt19937_64 g(11);
    const std::vector<Rect> ours = Draws(20000,
                                         [&](int i) {
                                           const AugmentParams p =
                                               DrawAugmentParams(k.h, k.w, o, 29, i % 3, i);
                                           return Rect{p.top, p.left, p.crop_h, p.crop_w};
                                         }),
                            theirs = Draws(200000, [&](int) {
                              return TorchvisionResizedCrop(k.h, k.w, k.scale, k.ratio, &g);
                            });
    ExpectSameStatistics(ours, theirs, k.h, k.w);
    EXPECT_EQ(Stats(ours, k.h, k.w).some, 1.0);  // every draw is a region
    // How often it is the fallback.
    const Rect fallback = TorchvisionCentreCrop(k.h, k.w, k.ratio);
    auto fraction = [&](const std::vector<Rect>& v) {
      return static_cast<double>(std::count(v.begin(), v.end(), fallback)) / v.size();
    };
    const double f = fraction(theirs);
    EXPECT_NEAR(fraction(ours), f, 5 * std::sqrt(f * (1 - f) / ours.size()) + 1e-3);
  }
  AugmentOptions o;
  o.out_h = o.out_w = 16;
  o.random_resized_crop = true;
  const AugmentParams p = DrawAugmentParams(10, 100, o, 1, 0, 0);
  EXPECT_EQ((Rect{p.top, p.left, p.crop_h, p.crop_w}),
            (Rect{0, 43, 10, 13}));  // round(10 * 4 / 3), (100 - 13) // 2
}

// The region is cut from the (resized) image, resized to the output by
// OpenCV, then flipped and normalised: bitwise that chain done by hand.
TEST(AugmentTest, RandomResizedCropResizesTheRegion) {
  for (const int resize : {0, 30}) {
    const int h = 40, w = 50, c = 3;
    const auto img = RandomImage(h, w, c, 60);
    AugmentOptions o;
    o.out_h = 12;
    o.out_w = 14;
    o.resize_min_side = resize;
    o.random_resized_crop = true;
    o.hflip = true;
    SetNorm(&o, kImagenet);
    cv::Mat image(h, w, CV_8UC3, const_cast<uint8_t*>(img.data()));
    if (resize > 0) cv::resize(image.clone(), image, cv::Size(37, 30), 0, 0, cv::INTER_LINEAR);
    for (int64_t i = 0; i < 12; ++i) {
      const AugmentParams p = DrawAugmentParams(image.rows, image.cols, o, 4, 0, i);
      cv::Mat region;
      cv::resize(image(cv::Rect(p.left, p.top, p.crop_w, p.crop_h)), region, cv::Size(14, 12), 0, 0,
                 cv::INTER_LINEAR);
      ASSERT_TRUE(region.isContinuous());
      const std::vector<uint8_t> small(region.data, region.data + 12 * 14 * 3);
      AugmentOptions plain = o;
      plain.random_resized_crop = false;
      ASSERT_TRUE(BitwiseEqual(RunAugment(img, h, w, c, o, 4, 0, i),
                               Reference(small, 12, 14, c, plain, AugmentParams{0, 0, p.flip})))
          << "sample " << i << ", resize " << resize;
    }
  }
  // It takes the place of pad and random_crop; bad ranges name the key.
  AugmentOptions o;
  o.out_h = o.out_w = 8;
  o.random_resized_crop = true;
  o.pad = 2;
  testing::ExpectContains(testing::ErrorOf<ConfigError>([&] { Augmenter{o}; }),
                          {"random_resized_crop", "pad 2"});
  o.pad = 0;
  o.crop_scale = {0.5, 0.2};
  testing::ExpectContains(testing::ErrorOf<ConfigError>([&] { Augmenter{o}; }), {"crop_scale"});
  o.crop_scale = {0.08, 1};
  o.crop_ratio = {-1, 1};
  testing::ExpectContains(testing::ErrorOf<ConfigError>([&] { Augmenter{o}; }), {"crop_ratio"});
}

// An image source's decoder of [3, 6, 7] samples with the given keys (the
// others at their defaults), and one training (or evaluation) sample of a
// 6 x 7 image through it, seed 9.
std::unique_ptr<ImageSampleDecoder> SourceDecoder(const std::map<std::string, ParamValue>& values) {
  Args a;
  for (const auto& [k, v] : values) a.Set(k, v);
  a.FillDefaults(AddImageAugmentParams(Schema()));
  return std::make_unique<ImageSampleDecoder>(Shape{3, 6, 7}, a);
}
std::vector<float> RunSource(const ImageSampleDecoder& d, const std::vector<uint8_t>& img,
                             int64_t epoch, int64_t i, bool train) {
  std::vector<float> out(3 * 6 * 7);
  d.AugmentPixels(img.data(), 6, 7, ReadContext{9, epoch, train}, i, out.data());
  return out;
}

// The image sources' keys (AddImageAugmentParams) reach the augmenter:
// hflip as a config gives it ("false", "true", "alternate") or as code sets
// it (a bool), pad_mode; training passes only. Bad values name the key.
TEST(AugmentTest, ImageSourceKeysAndTheirErrors) {
  const Schema schema = AddImageAugmentParams(Schema());
  ASSERT_NE(schema.Find("pad_mode"), nullptr);
  EXPECT_EQ(schema.Find("pad_mode")->choices, (std::vector<std::string>{"zero", "reflect"}));
  EXPECT_EQ(schema.Find("hflip")->choices,
            (std::vector<std::string>{"false", "true", "alternate"}));
  const auto decoder = SourceDecoder;
  const auto img = RandomImage(6, 7, 3, 40);
  auto run = [&](const ImageSampleDecoder& d, int64_t epoch, int64_t i, bool train = true) {
    return RunSource(d, img, epoch, i, train);
  };
  AugmentOptions o;
  o.out_h = 6;
  o.out_w = 7;
  o.hflip = true;
  // hflip: "true" is the bool true; "false" and the default flip nothing.
  const auto as_bool = decoder({{"hflip", true}}),
             as_string = decoder({{"hflip", std::string("true")}});
  const auto none = decoder({{"hflip", std::string("false")}}), by_default = decoder({});
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_TRUE(BitwiseEqual(run(*as_string, 3, i), run(*as_bool, 3, i)));
    EXPECT_TRUE(BitwiseEqual(run(*as_string, 3, i), RunAugment(img, 6, 7, 3, o, 9, 3, i)));
    EXPECT_TRUE(BitwiseEqual(run(*none, 3, i), run(*by_default, 3, i)));
    EXPECT_TRUE(BitwiseEqual(run(*none, 3, i), Reference(img, 6, 7, 3, o, {0, 0, false})));
  }
  // hflip: alternate, pad_mode: reflect, as the augmenter with those options.
  const auto airbench = decoder({{"pad", int64_t{2}},
                                 {"pad_mode", std::string("reflect")},
                                 {"random_crop", true},
                                 {"hflip", std::string("alternate")}});
  o.pad = 2;
  o.pad_mode = PadMode::kReflect;
  o.random_crop = true;
  o.alternate_flip = true;
  int flips_differ = 0;
  for (int64_t i = 0; i < 8; ++i) {
    for (int64_t epoch : {0, 1, 2}) {
      EXPECT_TRUE(BitwiseEqual(run(*airbench, epoch, i), RunAugment(img, 6, 7, 3, o, 9, epoch, i)));
    }
    flips_differ +=
        DrawAugmentParams(6, 7, o, 9, 0, i).flip != DrawAugmentParams(6, 7, o, 9, 1, i).flip;
    // Evaluation passes: the centre crop, unflipped, unpadded.
    EXPECT_TRUE(BitwiseEqual(run(*airbench, 1, i, false), run(*none, 1, i, false)));
  }
  EXPECT_EQ(flips_differ, 8);
  // Errors name the key and the value.
  testing::ExpectContains(testing::ErrorOf<ConfigError>([&] {
                            decoder({{"pad_mode", std::string("mirror")}});
                          }),
                          {"pad_mode", "'mirror'"});
  testing::ExpectContains(testing::ErrorOf<ConfigError>([&] {
                            decoder({{"hflip", std::string("sometimes")}});
                          }),
                          {"hflip", "'sometimes'"});
  // erase: in training passes only, as the augmenter draws it.
  const auto erasing = decoder({{"erase", 1.0},
                                {"erase_scale", std::vector<double>{0.1, 0.3}},
                                {"erase_ratio", std::vector<double>{0.5, 2.0}}});
  AugmentOptions e;
  e.out_h = 6;
  e.out_w = 7;
  e.erase_p = 1;
  e.erase_scale = {0.1, 0.3};
  e.erase_ratio = {0.5, 2.0};
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_TRUE(BitwiseEqual(run(*erasing, 2, i), RunAugment(img, 6, 7, 3, e, 9, 2, i)));
    EXPECT_TRUE(BitwiseEqual(run(*erasing, 2, i, false), run(*none, 2, i, false)));
  }
  // random_resized_crop: in training passes only.
  const auto rrc = decoder({{"random_resized_crop", true},
                            {"crop_scale", std::vector<double>{0.3, 0.9}},
                            {"crop_ratio", std::vector<double>{0.5, 2.0}}});
  AugmentOptions r;
  r.out_h = 6;
  r.out_w = 7;
  r.random_resized_crop = true;
  r.crop_scale = {0.3, 0.9};
  r.crop_ratio = {0.5, 2.0};
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_TRUE(BitwiseEqual(run(*rrc, 2, i), RunAugment(img, 6, 7, 3, r, 9, 2, i)));
    EXPECT_TRUE(BitwiseEqual(run(*rrc, 2, i, false), run(*none, 2, i, false)));
  }
  testing::ExpectContains(testing::ErrorOf<ConfigError>([&] {
                            decoder({{"erase_scale", std::vector<double>{0.1, 0.2, 0.3}}});
                          }),
                          {"erase_scale", "[lo, hi]", "3 values"});
  // pad 6 on a 6-row image: an error at the first sample.
  const auto too_big = decoder({{"pad", int64_t{6}}, {"pad_mode", std::string("reflect")}});
  testing::ExpectContains(testing::ErrorOf<ConfigError>([&] { run(*too_big, 0, 0); }),
                          {"pad_mode: reflect", "pad 6", "6x7"});
  run(*too_big, 0, 0, false);  // evaluation passes do not pad
}

// n 3-channel images of odd sizes (from seed0 on) augmented with `o` in
// `epoch` on 1 and on 2 threads: bitwise the same, and every stride-th
// sample equal to the one-shot Augment's.
void ExpectSameWithOneAndTwoThreads(const AugmentOptions& o, int n, uint64_t seed0, int64_t epoch,
                                    int stride) {
  const int c = 3;
  std::vector<std::vector<uint8_t>> imgs;
  std::vector<std::pair<int, int>> dims;
  for (int i = 0; i < n; ++i) {
    dims.emplace_back(30 + i % 7, 34 + i % 5);
    imgs.push_back(RandomImage(dims[i].first, dims[i].second, c, seed0 + i));
  }
  const Augmenter aug(o);
  const size_t sample = static_cast<size_t>(c) * o.out_h * o.out_w;
  auto run_all = [&](int threads) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    std::vector<float> out(n * sample);
    tbb::parallel_for(0, n, [&](int i) {
      aug.Run(imgs[i].data(), dims[i].first, dims[i].second, c, 7, epoch, i,
              out.data() + i * sample);
    });
    return out;
  };
  const auto one = run_all(1), two = run_all(2);
  EXPECT_TRUE(BitwiseEqual(one, two));
  std::vector<float> seq(sample);
  for (int i = 0; i < n; i += stride) {
    Augment(imgs[i].data(), dims[i].first, dims[i].second, c, o, 7, epoch, i, seq.data());
    EXPECT_EQ(std::memcmp(seq.data(), one.data() + i * sample, sample * sizeof(float)), 0);
  }
}

// Also with airbench's reflect padding and alternating flip, over two
// epochs.
TEST(AugmentTest, SameResultWithOneAndTwoThreads) {
  for (const bool airbench : {false, true}) {
    SCOPED_TRACE(airbench ? "reflect padding, alternating flip" : "zero padding, random flip");
    AugmentOptions o;
    o.out_h = o.out_w = 24;
    o.resize_min_side = 28;
    o.pad = 3;
    o.pad_mode = airbench ? PadMode::kReflect : PadMode::kZero;
    o.random_crop = true;
    o.hflip = true;
    o.alternate_flip = airbench;
    o.mean = {0.5f, 0.4f, 0.3f};
    o.std = {0.2f, 0.25f, 0.3f};
    for (const int64_t epoch : {1, 2}) ExpectSameWithOneAndTwoThreads(o, 64, 100, epoch, 9);
  }
}

TEST(AugmentTest, BadOptionsAndInputsThrow) {
  AugmentOptions o;
  EXPECT_THROW(Augmenter{o}, ConfigError);  // no output size
  o.out_h = o.out_w = 4;
  o.std = {0.5f, 0.f, 1.f};
  EXPECT_THROW(Augmenter{o}, ConfigError);  // std == 0
  o.std = {0.5f, 0.5f};
  o.mean = {0.1f, 0.2f, 0.3f};
  EXPECT_THROW(Augmenter{o}, ConfigError);  // 2 vs 3 values
  o.std = {0.5f, 0.5f, 0.5f};
  Augmenter aug(o);
  std::vector<uint8_t> img(16);
  std::vector<float> out(64);
  EXPECT_THROW(aug.RunWithParams(img.data(), 4, 4, 1, {}, out.data()), Error);  // 1 channel vs 3
}

// TrivialAugmentWide's draw: the op uniform over the 14, the bin uniform
// over the 31, the sign balanced for the signed ops and never drawn for the
// others; the crop, flip and erase draws unchanged by it (new counters).
TEST(AugmentTest, TrivialAugmentDrawsAreUniform) {
  AugmentOptions o;
  o.out_h = o.out_w = 8;
  o.pad = 2;
  o.random_crop = true;
  o.hflip = true;
  o.erase_p = 0.5;
  AugmentOptions t = o;
  t.trivial_augment = true;
  const int n = 28000;
  std::array<int, kTrivialOps> ops{};
  std::array<int, kTrivialBins> bins{};
  int negative = 0, signed_ops = 0, unsigned_negative = 0;
  for (int i = 0; i < n; ++i) {
    const AugmentParams p = DrawAugmentParams(10, 10, t, 5, 3, i);
    const AugmentParams q = DrawAugmentParams(10, 10, o, 5, 3, i);
    ASSERT_TRUE(p.top == q.top && p.left == q.left && p.flip == q.flip &&
                p.erase_top == q.erase_top && p.erase_h == q.erase_h && p.erase_w == q.erase_w);
    EXPECT_EQ(q.trivial_op, TrivialOp::kIdentity);
    const int op = static_cast<int>(p.trivial_op);
    ASSERT_TRUE(op >= 0 && op < kTrivialOps);
    ++ops[op];
    if (TrivialOpSigned(p.trivial_op)) {
      ++signed_ops;
      negative += p.trivial_magnitude < 0;
    } else {
      unsigned_negative += p.trivial_magnitude < 0;
    }
    // The bin, from the rotation's magnitude (4.5 degrees a bin).
    if (p.trivial_op == TrivialOp::kRotate) {
      const double bin = std::abs(p.trivial_magnitude) / 4.5;
      ASSERT_NEAR(bin, std::round(bin), 1e-5);
      ++bins[static_cast<int>(std::round(bin))];
    }
  }
  // Each op 2000 times expected, sd ~ 43.
  for (int op = 0; op < kTrivialOps; ++op) {
    EXPECT_NEAR(ops[op], n / kTrivialOps, 200) << TrivialOpName(static_cast<TrivialOp>(op));
  }
  // Rotate's bins: ~64.5 each, sd ~ 8.
  for (int b = 0; b < kTrivialBins; ++b) EXPECT_NEAR(bins[b], ops[5] / 31.0, 35) << "bin " << b;
  EXPECT_NEAR(negative / static_cast<double>(signed_ops), 0.5, 0.02);
  EXPECT_EQ(unsigned_negative, 0);
  // Keyed: another epoch, another draw for most samples.
  int same = 0;
  for (int i = 0; i < 200; ++i) {
    const AugmentParams a = DrawAugmentParams(10, 10, t, 5, 3, i);
    const AugmentParams b = DrawAugmentParams(10, 10, t, 5, 4, i);
    same += a.trivial_op == b.trivial_op && a.trivial_magnitude == b.trivial_magnitude;
  }
  EXPECT_LT(same, 40);
}

// ColorJitter's draw: each factor uniform in torchvision's range (the lower
// end clipped at 0), the hue shift in [-h, h], the order uniform over the 24
// permutations; nothing else moved.
TEST(AugmentTest, ColorJitterDrawsFollowTorchvisionsRanges) {
  AugmentOptions o;
  o.out_h = o.out_w = 8;
  o.random_crop = true;
  o.hflip = true;
  o.color_jitter = {0.4, 1.5, 0.2, 0.1};
  AugmentOptions plain = o;
  plain.color_jitter = {0, 0, 0, 0};
  const std::array<double, 4> lo{0.6, 0.0, 0.8, -0.1}, hi{1.4, 2.5, 1.2, 0.1};
  const int n = 24000;
  std::array<double, 4> mn{9, 9, 9, 9}, mx{-9, -9, -9, -9}, sum{};
  std::map<std::array<int, 4>, int> orders;
  for (int i = 0; i < n; ++i) {
    const AugmentParams p = DrawAugmentParams(12, 12, o, 8, 1, i);
    const AugmentParams q = DrawAugmentParams(12, 12, plain, 8, 1, i);
    ASSERT_TRUE(p.top == q.top && p.left == q.left && p.flip == q.flip);
    for (int k = 0; k < 4; ++k) {
      ASSERT_GE(p.jitter[k], lo[k]);
      ASSERT_LE(p.jitter[k], hi[k]);
      mn[k] = std::min(mn[k], p.jitter[k]);
      mx[k] = std::max(mx[k], p.jitter[k]);
      sum[k] += p.jitter[k];
    }
    ++orders[p.jitter_order];
  }
  for (int k = 0; k < 4; ++k) {
    const double width = hi[k] - lo[k];
    EXPECT_LT(mn[k] - lo[k], 0.002 * width) << k;
    EXPECT_LT(hi[k] - mx[k], 0.002 * width) << k;
    // The mean of a uniform: sd of the mean width / sqrt(12 n) ~ 0.002 width.
    EXPECT_NEAR(sum[k] / n, (lo[k] + hi[k]) / 2, 0.01 * width) << k;
  }
  // 24 permutations, ~1000 each (sd ~ 31).
  ASSERT_EQ(orders.size(), 24u);
  for (const auto& [order, count] : orders) {
    std::array<int, 4> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, (std::array<int, 4>{0, 1, 2, 3}));
    EXPECT_NEAR(count, n / 24, 160);
  }
}

// [h, w, c] uint8 -> the augmenter's chain written out: the crop (numpy.pad
// then slice), the flip, TrivialAugmentWide's op (image_ops, tested on its
// own), ColorJitter's ops in the drawn order on v / 255, the normalisation
// and the erased rectangle.
std::vector<float> ChainReference(const std::vector<uint8_t>& img, int h, int w, int c,
                                  const AugmentOptions& o, const AugmentParams& p) {
  const std::vector<uint8_t> padded = Padded(img, h, w, c, o.pad, o.pad_mode);
  const int pw = w + 2 * o.pad;
  std::vector<uint8_t> crop(static_cast<size_t>(o.out_h) * o.out_w * c);
  for (int y = 0; y < o.out_h; ++y) {
    for (int x = 0; x < o.out_w; ++x) {
      const int sx = p.left + (p.flip ? o.out_w - 1 - x : x);
      std::memcpy(&crop[(y * o.out_w + x) * c], &padded[((p.top + y) * pw + sx) * c], c);
    }
  }
  ApplyTrivialOp(p.trivial_op, p.trivial_magnitude, HwcU8{crop.data(), o.out_h, o.out_w, c});
  const int plane = o.out_h * o.out_w;
  std::vector<float> out(static_cast<size_t>(c) * plane);
  for (int ch = 0; ch < c; ++ch) {
    for (int i = 0; i < plane; ++i) out[ch * plane + i] = crop[i * c + ch] / 255.f;
  }
  const ChwF f{out.data(), o.out_h, o.out_w, c};
  for (int op : p.jitter_order) {
    if (o.color_jitter[op] == 0) continue;
    if (op == 0) AdjustBrightness(f, p.jitter[0]);
    if (op == 1) AdjustContrast(f, p.jitter[1]);
    if (op == 2) AdjustSaturation(f, p.jitter[2]);
    if (op == 3) AdjustHue(f, p.jitter[3]);
  }
  for (int ch = 0; ch < c; ++ch) {
    for (int i = 0; i < plane; ++i) {
      float& v = out[ch * plane + i];
      v = (v - o.mean[ch]) / o.std[ch];
      const int y = i / o.out_w, x = i % o.out_w;
      if (y >= p.erase_top && y < p.erase_top + p.erase_h && x >= p.erase_left &&
          x < p.erase_left + p.erase_w) {
        v = 0;
      }
    }
  }
  return out;
}

// The whole chain (reflect padding, random crop, flip, TrivialAugmentWide,
// ColorJitter, normalisation, erasing) against the reference, for 1 and 3
// channels; each op changes the sample; without them the fast path's
// result, bitwise.
TEST(AugmentTest, TrivialAugmentAndColorJitterRunInTheChain) {
  for (const int c : {3, 1}) {
    SCOPED_TRACE(c);
    const int h = 14, w = 15;
    AugmentOptions o;
    o.out_h = 12;
    o.out_w = 11;
    o.pad = 2;
    o.pad_mode = PadMode::kReflect;
    o.random_crop = true;
    o.hflip = true;
    o.erase_p = 0.5;
    o.mean = c == 3 ? kCifar.mean : std::vector<float>{0.45f};
    o.std = c == 3 ? kCifar.std : std::vector<float>{0.25f};
    AugmentOptions plain = o, trivial = o, jitter = o;
    trivial.trivial_augment = true;
    jitter.color_jitter = {0.4, 0.4, 0.4, 0.1};
    o.trivial_augment = true;
    o.color_jitter = {0.4, 0.4, 0.4, 0.1};
    const Augmenter both_aug(o), plain_aug(plain), trivial_aug(trivial), jitter_aug(jitter);
    int trivial_changed = 0, jitter_changed = 0;
    const int n = 60;
    for (int i = 0; i < n; ++i) {
      const auto img = RandomImage(h, w, c, 500 + i);
      const AugmentParams p = DrawAugmentParams(h, w, o, 3, 2, i);
      const size_t size = static_cast<size_t>(c) * o.out_h * o.out_w;
      std::vector<float> both(size), none(size), t(size), j(size);
      both_aug.Run(img.data(), h, w, c, 3, 2, i, both.data());
      EXPECT_TRUE(BitwiseEqual(both, ChainReference(img, h, w, c, o, p))) << "sample " << i;
      plain_aug.Run(img.data(), h, w, c, 3, 2, i, none.data());
      AugmentParams q = p;
      q.trivial_op = TrivialOp::kIdentity;
      EXPECT_TRUE(BitwiseEqual(none, ChainReference(img, h, w, c, plain, q)));
      if (p.erase_h == 0) {
        EXPECT_TRUE(BitwiseEqual(none, Reference(img, h, w, c, plain, q)));
      }
      trivial_aug.Run(img.data(), h, w, c, 3, 2, i, t.data());
      jitter_aug.Run(img.data(), h, w, c, 3, 2, i, j.data());
      EXPECT_TRUE(BitwiseEqual(t, ChainReference(img, h, w, c, trivial, p)));
      EXPECT_TRUE(BitwiseEqual(j, ChainReference(img, h, w, c, jitter, q)));
      trivial_changed += !BitwiseEqual(t, none);
      jitter_changed += !BitwiseEqual(j, none);
    }
    // Identity (1 in 14), magnitude-0 bins, and on gray images Color, leave
    // a sample as it is.
    EXPECT_GT(trivial_changed, n * 2 / 3);
    EXPECT_EQ(jitter_changed, n);
  }
}

// The image sources' keys: trivial_augment and color_jitter (1 to 4 values,
// the rest 0) reach the augmenter in training passes only; bad values name
// the key and the allowed range.
TEST(AugmentTest, TrivialAugmentAndColorJitterKeys) {
  const Schema schema = AddImageAugmentParams(Schema());
  ASSERT_NE(schema.Find("trivial_augment"), nullptr);
  ASSERT_NE(schema.Find("color_jitter"), nullptr);
  const auto decoder = SourceDecoder;
  const auto img = RandomImage(6, 7, 3, 41);
  auto run = [&](const ImageSampleDecoder& d, int64_t epoch, int64_t i, bool train = true) {
    return RunSource(d, img, epoch, i, train);
  };
  const auto none = decoder({});
  const auto both = decoder(
      {{"trivial_augment", true}, {"color_jitter", std::vector<double>{0.4, 0.3, 0.2, 0.1}}});
  const auto brightness = decoder({{"color_jitter", std::vector<double>{0.5}}});
  AugmentOptions o;
  o.out_h = 6;
  o.out_w = 7;
  o.trivial_augment = true;
  o.color_jitter = {0.4, 0.3, 0.2, 0.1};
  AugmentOptions b;
  b.out_h = 6;
  b.out_w = 7;
  b.color_jitter = {0.5, 0, 0, 0};
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_TRUE(BitwiseEqual(run(*both, 2, i), RunAugment(img, 6, 7, 3, o, 9, 2, i)));
    EXPECT_FALSE(BitwiseEqual(run(*both, 2, i), run(*none, 2, i)));
    EXPECT_TRUE(BitwiseEqual(run(*brightness, 2, i), RunAugment(img, 6, 7, 3, b, 9, 2, i)));
    // Evaluation passes: neither.
    EXPECT_TRUE(BitwiseEqual(run(*both, 2, i, false), run(*none, 2, i, false)));
  }
  // A brightness-only jitter scales every value by one factor.
  const auto base = run(*none, 2, 3), scaled = run(*brightness, 2, 3);
  const double factor = scaled[0] / base[0];
  for (size_t k = 0; k < base.size(); ++k) {
    EXPECT_NEAR(scaled[k], std::min(1.0, base[k] * factor), 1e-6);
  }
  testing::ExpectContains(
      testing::ErrorOf<ConfigError>([&] {
        decoder({{"color_jitter", std::vector<double>{0.1, 0.1, 0.1, 0.1, 0.1}}});
      }),
      {"color_jitter", "1 to 4 values", "got 5"});
  testing::ExpectContains(testing::ErrorOf<ConfigError>([&] {
                            decoder({{"color_jitter", std::vector<double>{0.1, -0.2}}});
                          }),
                          {"color_jitter", "contrast", ">= 0", "-0.2"});
  testing::ExpectContains(testing::ErrorOf<ConfigError>([&] {
                            decoder({{"color_jitter", std::vector<double>{0, 0, 0, 0.6}}});
                          }),
                          {"color_jitter", "hue", "[0, 0.5]", "0.6"});
  AugmentOptions bad;
  bad.out_h = bad.out_w = 4;
  bad.color_jitter = {std::nan(""), 0, 0, 0};
  testing::ExpectContains(testing::ErrorOf<ConfigError>([&] { Augmenter{bad}; }),
                          {"color_jitter", "brightness"});
  // 2- and 4-channel images are refused with either op on, not without.
  bad.color_jitter = {0, 0, 0, 0};
  bad.trivial_augment = true;
  std::vector<uint8_t> four(4 * 4 * 4);
  std::vector<float> out(4 * 4 * 4);
  AugmentParams p;  // Identity drawn: refused all the same
  testing::ExpectContains(testing::ErrorOf<Error>([&] {
                            Augmenter(bad).RunWithParams(four.data(), 4, 4, 4, p, out.data());
                          }),
                          {"trivial_augment", "1 or 3 channels", "got 4"});
  bad.trivial_augment = false;
  Augmenter(bad).RunWithParams(four.data(), 4, 4, 4, {}, out.data());
}

// Both on, with a resize and RandomResizedCrop: the same samples with 1 and
// 2 threads, and as the one-shot Augment.
TEST(AugmentTest, TrivialAugmentAndColorJitterSameWithOneAndTwoThreads) {
  AugmentOptions o;
  o.out_h = o.out_w = 20;
  o.resize_min_side = 28;
  o.random_resized_crop = true;
  o.hflip = true;
  o.trivial_augment = true;
  o.color_jitter = {0.4, 0.4, 0.4, 0.1};
  o.mean = kImagenet.mean;
  o.std = kImagenet.std;
  ExpectSameWithOneAndTwoThreads(o, 48, 300, 1, 7);
}

}  // namespace
}  // namespace cnnflow
