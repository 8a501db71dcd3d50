// The device-resident set's batch kernel against its CPU reference
// (ops/crop_flip.h, itself bitwise the CPU loader's: tests/loaders/
// crop_flip_test.cc): the same draws give the same bits in f32, NCHW and
// NHWC, zero and reflect padding, flips, crops past the padding; f16 and
// bf16 are the reference rounded to nearest even. Without a GPU the set
// is an error. GPU tests skip without a GPU.
#include "ops/cuda/resident_set.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "ops/crop_flip.h"
#include "ops/random.h"
#include "tests/ops/cuda/util.h"
#include "tests/ops/gpu_check.h"

namespace cnnflow {
namespace {

using namespace ::cnnflow::testing;  // tests/ops/cuda/util.h, gpu_check.h

struct Set {
  int64_t n;
  int c, h, w;
  std::vector<uint8_t> pixels;  // [n, c, h, w]
};

Set RandomSet(int64_t n, int c, int h, int w, uint64_t seed) {
  Set s{n, c, h, w, std::vector<uint8_t>(static_cast<size_t>(n * c * h * w))};
  Rng rng(seed);
  for (auto& v : s.pixels) v = static_cast<uint8_t>(rng.Below(256));
  return s;
}

// Draws over every offset the geometry allows (and past it: crops larger
// than the padded image start at negative offsets), images in any order.
std::vector<CropFlipDraw> RandomDraws(const Set& s, const CropFlipGeometry& g, int64_t n,
                                      uint64_t seed) {
  Rng rng(seed);
  const int range_h = g.h + 2 * g.pad - g.out_h, range_w = g.w + 2 * g.pad - g.out_w;
  std::vector<CropFlipDraw> d(static_cast<size_t>(n));
  for (auto& x : d) {
    x.image = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(s.n)));
    x.top = range_h < 0 ? -((-range_h) / 2) : static_cast<int32_t>(rng.Below(range_h + 1));
    x.left = range_w < 0 ? -((-range_w) / 2) : static_cast<int32_t>(rng.Below(range_w + 1));
    x.flip = static_cast<int32_t>(rng.Below(2));
  }
  return d;
}

// The reference batch, f32, in the asked layout.
std::vector<float> Reference(const Set& s, const ResidentImages::BatchFormat& f,
                             const std::vector<CropFlipDraw>& draws) {
  const CropFlipGeometry& g = f.geometry;
  const int64_t per = int64_t{g.channels} * g.out_h * g.out_w;
  std::vector<float> out(draws.size() * per);
  for (size_t b = 0; b < draws.size(); ++b) {
    const uint8_t* image = s.pixels.data() + int64_t{draws[b].image} * s.c * s.h * s.w;
    CropFlipReference(image, g, draws[b], f.mean.data(), f.std.data(), f.nhwc,
                      out.data() + b * per);
  }
  return out;
}

struct Geometry {
  int c, h, w, out_h, out_w, pad, reflect;
};

TEST(ResidentSetGPU, BatchEqualsTheCpuReferenceBitwise) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  for (const Geometry& k : {Geometry{3, 32, 32, 32, 32, 2, 1}, Geometry{3, 32, 32, 32, 32, 4, 0},
                            Geometry{1, 28, 28, 24, 24, 0, 0}, Geometry{3, 12, 40, 10, 17, 3, 1},
                            Geometry{3, 8, 8, 14, 13, 1, 0}, Geometry{4, 6, 6, 11, 9, 2, 1}}) {
    const Set s = RandomSet(37, k.c, k.h, k.w, 3 + k.h);
    const ResidentImages set(kGpu, s.pixels.data(), s.n, s.c, s.h, s.w);
    EXPECT_EQ(set.bytes(), s.pixels.size());
    ResidentImages::BatchFormat f;
    f.geometry = {k.c, k.h, k.w, k.out_h, k.out_w, k.pad, k.reflect};
    f.mean = {0.4914f, 0.4822f, 0.4465f, 0.5f};
    f.std = {0.2470f, 0.2435f, 0.2616f, 0.25f};
    f.mean.resize(k.c);
    f.std.resize(k.c);
    const std::vector<CropFlipDraw> draws = RandomDraws(s, f.geometry, 64, 11);
    for (const bool nhwc : {false, true}) {
      SCOPED_TRACE(StrCat("[", k.c, ", ", k.h, ", ", k.w, "] -> ", k.out_h, "x", k.out_w, " pad ",
                          k.pad, k.reflect ? " reflect" : " zero", nhwc ? ", NHWC" : ", NCHW"));
      f.nhwc = nhwc;
      const std::vector<float> want = Reference(s, f, draws);
      const Tensor got = set.MakeBatch(draws.data(), static_cast<int64_t>(draws.size()), f);
      EXPECT_EQ(got.shape(), (Shape{64, k.c, k.out_h, k.out_w}));
      const std::vector<float> bits = DownloadF32(got);
      ASSERT_EQ(bits.size(), want.size());
      int64_t bad = 0, first = -1;
      for (size_t i = 0; i < want.size(); ++i) {
        if (FloatBits(bits[i]) != FloatBits(want[i])) {
          if (first < 0) first = static_cast<int64_t>(i);
          ++bad;
        }
      }
      EXPECT_EQ(bad, 0) << "first at " << first;
      // Half precision: the reference rounded to nearest even.
      for (const DType t : {DType::kF16, DType::kBF16}) {
        f.dtype = t;
        const std::vector<uint16_t> half =
            Download16(set.MakeBatch(draws.data(), static_cast<int64_t>(draws.size()), f));
        f.dtype = DType::kF32;
        int64_t bad16 = 0;
        for (size_t i = 0; i < want.size(); ++i) bad16 += half[i] != HostTo(t, want[i]);
        EXPECT_EQ(bad16, 0) << DTypeName(t);
      }
    }
  }
}

TEST(ResidentSetGPU, BadDrawsAndFormatsThrow) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const Set s = RandomSet(4, 3, 8, 8, 1);
  const ResidentImages set(kGpu, s.pixels.data(), s.n, s.c, s.h, s.w);
  ResidentImages::BatchFormat f;
  f.geometry = {3, 8, 8, 8, 8, 2, 1};
  f.mean = {0, 0, 0};
  f.std = {1, 1, 1};
  std::vector<CropFlipDraw> draws{{4, 0, 0, 0}};  // image 4 of 4
  EXPECT_THROW(set.MakeBatch(draws.data(), 1, f), Error);
  draws[0].image = 3;
  EXPECT_NO_THROW(set.MakeBatch(draws.data(), 1, f));
  f.geometry.h = 9;  // not the set's
  EXPECT_THROW(set.MakeBatch(draws.data(), 1, f), Error);
  f.geometry.h = 8;
  f.mean = {0};
  EXPECT_THROW(set.MakeBatch(draws.data(), 1, f), Error);
}

// Without a GPU (a CUDA build on a CPU machine, or the stub of a build
// without CUDA) asking for the set is an error, not a crash.
TEST(ResidentSetTest, WithoutAGpuTheSetIsAnError) {
  if (CudaAvailable()) GTEST_SKIP() << "a GPU is here";
  const std::vector<uint8_t> px(3 * 4 * 4);
  EXPECT_THROW(ResidentImages(Device::Cuda(0), px.data(), 1, 3, 4, 4), Error);
}

}  // namespace
}  // namespace cnnflow
