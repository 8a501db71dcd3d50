// Augment: crops, flips, padding and normalisation against a naive
// reference; reproducibility per (seed, epoch, sample) whatever the threads.
#include "loaders/augment.h"

#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <set>
#include <vector>

#include "ops/cpu/isa.h"
#include "ops/error.h"
#include "ops/random.h"

namespace cnnflow {
namespace {

std::vector<uint8_t> RandomImage(int h, int w, int c, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint8_t> p(static_cast<size_t>(h) * w * c);
  for (auto& v : p) v = static_cast<uint8_t>(rng.Below(256));
  return p;
}

float Norm(int v, float mean, float std) { return (static_cast<float>(v) / 255.f - mean) / std; }

// Plain loops over the zero-padded image, no resize: [c, out_h, out_w].
std::vector<float> Reference(const std::vector<uint8_t>& img, int h, int w, int c,
                             const AugmentOptions& o, const AugmentParams& p) {
  std::vector<float> out(static_cast<size_t>(c) * o.out_h * o.out_w);
  for (int ch = 0; ch < c; ++ch) {
    const float mean = o.mean.empty() ? 0.f : o.mean[o.mean.size() == 1 ? 0 : ch];
    const float std = o.std.empty() ? 1.f : o.std[o.std.size() == 1 ? 0 : ch];
    for (int y = 0; y < o.out_h; ++y) {
      for (int x = 0; x < o.out_w; ++x) {
        const int xx = p.flip ? o.out_w - 1 - x : x;
        const int iy = p.top + y - o.pad, ix = p.left + xx - o.pad;  // image coords
        int v = 0;
        if (iy >= 0 && iy < h && ix >= 0 && ix < w) v = img[(iy * w + ix) * c + ch];
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
  o.mean = {0.485f, 0.456f, 0.406f};
  o.std = {0.229f, 0.224f, 0.225f};
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
        SCOPED_TRACE(testing::Message() << "c " << c << ", w " << w);
        const int h = 5;
        const auto img = RandomImage(h, w, c, 11 + w);
        AugmentOptions o;
        o.out_h = 4;
        o.out_w = w - 2;
        o.pad = 3;
        if (c == 3) {
          o.mean = {0.4914f, 0.4822f, 0.4465f};
          o.std = {0.2470f, 0.2435f, 0.2616f};
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
  for (const AugmentParams base :
       {AugmentParams{0, 0, false}, AugmentParams{2, 3, false}, AugmentParams{1, 1, false}}) {
    AugmentParams flipped = base;
    flipped.flip = true;
    std::vector<float> a(c * 20), b(c * 20);
    aug.RunWithParams(img.data(), h, w, c, base, a.data());
    aug.RunWithParams(img.data(), h, w, c, flipped, b.data());
    for (int ch = 0; ch < c; ++ch) {
      for (int y = 0; y < 4; ++y) {
        for (int x = 0; x < 5; ++x) {
          ASSERT_EQ(b[(ch * 4 + y) * 5 + x], a[(ch * 4 + y) * 5 + (4 - x)]);
        }
      }
    }
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
  o.mean = {0.4914f, 0.4822f, 0.4465f};
  o.std = {0.2470f, 0.2435f, 0.2616f};
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
  o.mean = {0.485f, 0.456f, 0.406f};
  o.std = {0.229f, 0.224f, 0.225f};
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

TEST(AugmentTest, SameResultWithOneAndTwoThreads) {
  const int n = 64, c = 3;
  std::vector<std::vector<uint8_t>> imgs;
  std::vector<std::pair<int, int>> dims;
  for (int i = 0; i < n; ++i) {
    dims.emplace_back(30 + i % 7, 34 + i % 5);
    imgs.push_back(RandomImage(dims[i].first, dims[i].second, c, 100 + i));
  }
  AugmentOptions o;
  o.out_h = o.out_w = 24;
  o.resize_min_side = 28;
  o.pad = 3;
  o.random_crop = true;
  o.hflip = true;
  o.mean = {0.5f, 0.4f, 0.3f};
  o.std = {0.2f, 0.25f, 0.3f};
  const Augmenter aug(o);
  const size_t sample = c * 24 * 24;
  auto run_all = [&](int threads) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    std::vector<float> out(n * sample);
    tbb::parallel_for(0, n, [&](int i) {
      aug.Run(imgs[i].data(), dims[i].first, dims[i].second, c, 7, 1, i, out.data() + i * sample);
    });
    return out;
  };
  const auto one = run_all(1), two = run_all(2);
  EXPECT_TRUE(BitwiseEqual(one, two));
  std::vector<float> seq(sample);
  for (int i = 0; i < n; i += 9) {
    Augment(imgs[i].data(), dims[i].first, dims[i].second, c, o, 7, 1, i, seq.data());
    EXPECT_EQ(std::memcmp(seq.data(), one.data() + i * sample, sample * sizeof(float)), 0);
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

}  // namespace
}  // namespace cnnflow
