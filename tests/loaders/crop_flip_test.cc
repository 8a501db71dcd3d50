// The device-resident set's CPU reference (ops/crop_flip.h) against the CPU
// loader: for many samples and epochs, zero and reflect padding, random and
// alternating flips, crops inside and larger than the padded image, the
// reference's pixels under DrawCropFlip's draw are bitwise the Augmenter's.
// A draw moved by one pixel (or the flip's mirror moved by one) must not
// match, so the comparison would catch an off-by-one.
#include "ops/crop_flip.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "loaders/augment.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

using testing::RandomImage;

// HWC -> CHW, as the resident set holds its images.
std::vector<uint8_t> ToChw(const std::vector<uint8_t>& hwc, int h, int w, int c) {
  std::vector<uint8_t> chw(hwc.size());
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int ch = 0; ch < c; ++ch) chw[(ch * h + y) * w + x] = hwc[(y * w + x) * c + ch];
    }
  }
  return chw;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Whether two draws read the same source pixel at every destination pixel.
bool SameSources(const CropFlipGeometry& g, const CropFlipDraw& a, const CropFlipDraw& b) {
  for (int y = 0; y < g.out_h; ++y) {
    for (int x = 0; x < g.out_w; ++x) {
      if (CropFlipSource(g, a, y, x) != CropFlipSource(g, b, y, x)) return false;
    }
  }
  return true;
}

struct Case {
  std::string name;
  int h, w, c;  // source
  int out_h, out_w;
  int pad;
  PadMode mode;
  bool alternate;
  bool normalise;
};

// Every (sample, epoch) of the case: the reference equals the loader.
void CheckCase(const Case& k) {
  SCOPED_TRACE(k.name);
  AugmentOptions o;
  o.out_h = k.out_h;
  o.out_w = k.out_w;
  o.pad = k.pad;
  o.pad_mode = k.mode;
  o.random_crop = true;
  o.hflip = true;
  o.alternate_flip = k.alternate;
  if (k.normalise) {
    o.mean = {0.4914f, 0.4822f, 0.4465f};
    o.std = {0.2470f, 0.2435f, 0.2616f};
    o.mean.resize(k.c);
    o.std.resize(k.c);
  }
  ASSERT_EQ(CropFlipUnsupported(o), "");
  const Augmenter aug(o);
  const CropFlipGeometry g = CropFlipGeometryOf(o, k.c, k.h, k.w);
  std::vector<float> mean, std;
  CropFlipNormalisation(o, k.c, &mean, &std);
  const int64_t per = int64_t{k.c} * k.out_h * k.out_w;
  std::vector<float> want(per), got(per), nhwc(per);
  int flips = 0, draws = 0, off_by_one_caught = 0, off_by_one_tries = 0;
  for (int64_t sample = 0; sample < 40; ++sample) {
    const std::vector<uint8_t> hwc = RandomImage(k.h, k.w, k.c, 100 + sample);
    const std::vector<uint8_t> chw = ToChw(hwc, k.h, k.w, k.c);
    for (int64_t epoch = 0; epoch < 6; ++epoch) {
      aug.Run(hwc.data(), k.h, k.w, k.c, 7, epoch, sample, want.data());
      const CropFlipDraw d = DrawCropFlip(o, k.h, k.w, 7, epoch, sample, 0);
      CropFlipReference(chw.data(), g, d, mean.data(), std.data(), false, got.data());
      ASSERT_TRUE(SameBits(want, got)) << "sample " << sample << ", epoch " << epoch << ": top "
                                       << d.top << ", left " << d.left << ", flip " << d.flip;
      // Channels-last: the same values, transposed.
      CropFlipReference(chw.data(), g, d, mean.data(), std.data(), true, nhwc.data());
      for (int ch = 0; ch < k.c; ++ch) {
        for (int i = 0; i < k.out_h * k.out_w; ++i) {
          ASSERT_EQ(nhwc[i * k.c + ch], got[ch * k.out_h * k.out_w + i]);
        }
      }
      flips += d.flip;
      ++draws;
      // The comparison is sharp: a crop moved by a pixel, or the other
      // flip, gives other pixels (the random image has no symmetry), unless
      // it reads the very same source pixels (a reflect-padded crop centred
      // on the image's edge is a palindrome: its flip is itself).
      for (const CropFlipDraw& wrong :
           {CropFlipDraw{0, d.top + 1, d.left, d.flip}, CropFlipDraw{0, d.top, d.left - 1, d.flip},
            CropFlipDraw{0, d.top, d.left, 1 - d.flip}}) {
        if (SameSources(g, d, wrong)) continue;
        CropFlipReference(chw.data(), g, wrong, mean.data(), std.data(), false, got.data());
        off_by_one_caught += !SameBits(want, got);
        ++off_by_one_tries;
      }
    }
  }
  EXPECT_EQ(off_by_one_caught, off_by_one_tries);
  EXPECT_GT(off_by_one_tries, 2 * draws);  // nearly every moved draw reads other pixels
  EXPECT_GT(flips, draws / 4);             // both flips are exercised
  EXPECT_LT(flips, 3 * draws / 4);
}

TEST(CropFlipTest, ReferenceEqualsTheLoaderZeroPadding) {
  CheckCase({"cifar zero pad 4, random flip", 32, 32, 3, 32, 32, 4, PadMode::kZero, false, true});
  CheckCase({"cifar zero pad 2, alternate", 32, 32, 3, 32, 32, 2, PadMode::kZero, true, true});
  CheckCase({"gray 28, crop 24", 28, 28, 1, 24, 24, 0, PadMode::kZero, false, false});
  CheckCase({"wide, crop narrower", 12, 40, 3, 10, 17, 3, PadMode::kZero, true, true});
  // A crop larger than the padded image: centred, zeros beyond the padding.
  CheckCase({"crop beyond the padding", 8, 8, 3, 14, 13, 1, PadMode::kZero, false, true});
}

TEST(CropFlipTest, ReferenceEqualsTheLoaderReflectPadding) {
  CheckCase({"cifar reflect 2, alternate (airbench)", 32, 32, 3, 32, 32, 2, PadMode::kReflect, true,
             true});
  CheckCase({"cifar reflect 4, random flip", 32, 32, 3, 32, 32, 4, PadMode::kReflect, false, true});
  CheckCase({"small reflect 3", 5, 7, 1, 5, 7, 3, PadMode::kReflect, true, false});
  CheckCase(
      {"reflect, crop beyond the padding", 6, 6, 3, 11, 9, 2, PadMode::kReflect, false, true});
}

// airbench's alternating flip through the resident set's draws: each
// sample's flip reverses every epoch, and epoch 0 is the random flip's draw.
TEST(CropFlipTest, AlternatingFlipAlternatesAcrossEpochs) {
  AugmentOptions o;
  o.out_h = o.out_w = 32;
  o.pad = 2;
  o.pad_mode = PadMode::kReflect;
  o.random_crop = true;
  o.hflip = true;
  o.alternate_flip = true;
  AugmentOptions random = o;
  random.alternate_flip = false;
  int first = 0;
  for (int64_t sample = 0; sample < 500; ++sample) {
    const int f0 = DrawCropFlip(o, 32, 32, 3, 0, sample, 0).flip;
    first += f0;
    EXPECT_EQ(f0, DrawCropFlip(random, 32, 32, 3, 0, sample, 0).flip);
    for (int64_t epoch = 1; epoch < 8; ++epoch) {
      ASSERT_EQ(DrawCropFlip(o, 32, 32, 3, epoch, sample, 0).flip, f0 ^ static_cast<int>(epoch & 1))
          << "sample " << sample << ", epoch " << epoch;
    }
  }
  EXPECT_GT(first, 180);
  EXPECT_LT(first, 320);
}

TEST(CropFlipTest, UnsupportedAugmentationsAreNamed) {
  AugmentOptions o;
  o.out_h = o.out_w = 32;
  EXPECT_EQ(CropFlipUnsupported(o), "");
  AugmentOptions a = o;
  a.resize_min_side = 36;
  EXPECT_EQ(CropFlipUnsupported(a), "resize_min_side");
  a = o;
  a.random_resized_crop = true;
  EXPECT_EQ(CropFlipUnsupported(a), "random_resized_crop");
  a = o;
  a.erase_p = 0.25;
  EXPECT_EQ(CropFlipUnsupported(a), "erase");
  a = o;
  a.trivial_augment = true;
  EXPECT_EQ(CropFlipUnsupported(a), "trivial_augment");
  a = o;
  a.color_jitter = {0.2, 0, 0, 0};
  EXPECT_EQ(CropFlipUnsupported(a), "color_jitter");
}

}  // namespace
}  // namespace cnnflow
