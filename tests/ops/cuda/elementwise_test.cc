// The elementwise CUDA kernels: Axpy / Scale, Cast / AddCast, and the loss
// scaler's UnscaleAndFindNonFinite, against host references (the f16/bf16
// rounding references are tested here on the CPU too). GPU tests skip
// without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfenv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ops/cuda/batch_stager.h"
#include "ops/cuda/kernels.h"
#include "ops/layers/dropout.h"
#include "ops/loss.h"
#include "ops/train/optimizer.h"
#include "tests/ops/cuda/util.h"
#include "tests/ops/gpu_check.h"
#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

using namespace ::cnnflow::testing;  // tests/ops/cuda/util.h, gpu_check.h

// ---------------------------------------------------------------- Axpy, Scale

TEST(AxpyScaleGPU, MatchHost) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  for (const int64_t n : {int64_t{1}, int64_t{6}, int64_t{1001}, int64_t{1} << 20}) {
    SCOPED_TRACE(StrCat("n ", n));
    const Tensor x = RandomTensor(Shape{n}, 1, -1, 1, DType::kF32);
    const Tensor y = RandomTensor(Shape{n}, 2, -1, 1, DType::kF32);
    Tensor yg = y.To(kGpu);
    cuda::Axpy(-0.75f, x.To(kGpu), yg);
    cuda::Scale(yg, 3.0f);
    const Tensor got = yg.To(Device::Cpu());
    for (int64_t i = 0; i < n; ++i) {
      const float want =
          (static_cast<float>(y.At(i)) + -0.75f * static_cast<float>(x.At(i))) * 3.0f;
      ASSERT_NEAR(got.At(i), want, 1e-6) << "element " << i;
    }
  }
}

TEST(AxpyScaleGPU, UnalignedViews) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // Rows 1.. of a [5, 3] tensor start 12 bytes in: not float4-aligned.
  const Tensor x = RandomTensor(Shape{5, 3}, 3, -1, 1, DType::kF32);
  const Tensor y = RandomTensor(Shape{5, 3}, 4, -1, 1, DType::kF32);
  const Tensor xg = x.To(kGpu);
  Tensor yg = y.To(kGpu);
  Tensor ys = yg.Slice(1, 5);
  cuda::Axpy(2.0f, xg.Slice(0, 4), ys);
  cuda::Scale(ys, 0.5f);
  const Tensor got = yg.To(Device::Cpu());
  for (int64_t i = 0; i < 15; ++i) {
    const float want =
        i < 3 ? static_cast<float>(y.At(i))
              : (static_cast<float>(y.At(i)) + 2.0f * static_cast<float>(x.At(i - 3))) * 0.5f;
    EXPECT_NEAR(got.At(i), want, 1e-6) << "element " << i;
  }
}

TEST(AxpyScaleGPU, RejectHostAndF64Tensors) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  Tensor host = Tensor::Zeros(Shape{4});
  Tensor gpu = Tensor::Zeros(Shape{4}, DType::kF32, kGpu);
  EXPECT_THROW(cuda::Axpy(1.0f, host, gpu), Error);
  EXPECT_THROW(cuda::Scale(host, 2.0f), Error);
  Tensor f64 = Tensor::Zeros(Shape{4}, DType::kF64, kGpu);
  EXPECT_THROW(cuda::Scale(f64, 2.0f), Error);
  Tensor other = Tensor::Zeros(Shape{5}, DType::kF32, kGpu);
  EXPECT_THROW(cuda::Axpy(1.0f, other, gpu), Error);
}

// The references themselves, on known values (CPU: runs everywhere).
TEST(HalfReference, KnownValues) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  EXPECT_EQ(HostToF16(1.0f), 0x3c00);
  EXPECT_EQ(HostToF16(-2.0f), 0xc000);
  EXPECT_EQ(HostToF16(65504.0f), 0x7bff);
  EXPECT_EQ(HostToF16(65519.0f), 0x7bff);
  EXPECT_EQ(HostToF16(65520.0f), 0x7c00);
  EXPECT_EQ(HostToF16(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(HostToF16(std::ldexp(1.0f, -25)), 0x0000);         // a tie: to even (0)
  EXPECT_EQ(HostToF16(std::ldexp(3.0f, -25)), 0x0002);         // 1.5 units: to even (2)
  EXPECT_EQ(HostToF16(std::ldexp(1023.5f, -24)), 0x0400);      // rounds up to the smallest normal
  EXPECT_EQ(HostToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // a tie: to even
  EXPECT_EQ(HostToF16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // a tie: to even (up)
  EXPECT_EQ(HostToF16(2047.5f), 0x6800);                       // carry into the exponent: 2048
  EXPECT_TRUE(std::isnan(HostFromF16(HostToF16(NAN))));
  EXPECT_EQ(HostToBf16(1.0f), 0x3f80);
  EXPECT_EQ(HostToBf16(BitsFloat(0x3f808000)), 0x3f80);  // a tie: to even
  EXPECT_EQ(HostToBf16(BitsFloat(0x3f818000)), 0x3f82);  // a tie: to even (up)
  EXPECT_EQ(HostToBf16(BitsFloat(0x3f808001)), 0x3f81);
  EXPECT_EQ(HostToBf16(BitsFloat(0x7f7fffff)), 0x7f80);  // FLT_MAX: inf
  EXPECT_TRUE(std::isnan(HostFromBf16(HostToBf16(NAN))));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    if (!std::isnan(HostFromF16(b))) {
      ASSERT_EQ(HostToF16(HostFromF16(b)), b) << "f16 " << h;
    }
    if (!std::isnan(HostFromBf16(b))) {
      ASSERT_EQ(HostToBf16(HostFromBf16(b)), b) << "bf16 " << h;
    }
  }
  EXPECT_EQ(HostFromF16(0x3555), 0.333251953125f);
}

// and random values of many magnitudes.
std::vector<float> CastProbe() {
  std::vector<float> v = {0.f,
                          -0.f,
                          1.f,
                          -1.f,
                          65504.f,
                          65519.f,
                          65520.f,
                          1e6f,
                          -1e30f,
                          std::ldexp(1.f, -24),
                          std::ldexp(1.f, -25),
                          std::ldexp(3.f, -25),
                          std::ldexp(1023.5f, -24),
                          1.f + std::ldexp(1.f, -11),
                          1.f + std::ldexp(3.f, -11),
                          BitsFloat(0x3f808000),
                          BitsFloat(0x3f818000),
                          BitsFloat(0x7f7fffff),
                          std::ldexp(1.f, -130),
                          INFINITY,
                          -INFINITY,
                          NAN};
  const Tensor r = RandomTensor(Shape{5000}, 77, -1, 1, DType::kF32);
  for (int64_t i = 0; i < r.numel(); ++i) {
    v.push_back(static_cast<float>(r.At(i)) * std::ldexp(1.f, static_cast<int>(i % 60) - 30));
  }
  return v;
}

TEST(CastGPU, F32ToHalfMatchesHostRounding) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const std::vector<float> v = CastProbe();
  const Tensor src = UploadF32(v);
  for (const DType t : {DType::kF16, DType::kBF16}) {
    Tensor dst = Tensor::Empty(src.shape(), t, kGpu);
    cuda::Cast(src, dst);
    const std::vector<uint16_t> got = Download16(dst);
    for (size_t i = 0; i < v.size(); ++i) {
      if (std::isnan(v[i])) {
        EXPECT_TRUE(std::isnan(HostFrom(t, got[i]))) << DTypeName(t) << " of NaN";
        continue;
      }
      ASSERT_EQ(got[i], HostTo(t, v[i])) << DTypeName(t) << " of " << v[i] << " (bits 0x"
                                         << std::hex << FloatBits(v[i]) << ") at " << std::dec << i;
    }
  }
}

TEST(CastGPU, EveryHalfValueToF32AndBack) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
  for (const DType t : {DType::kF16, DType::kBF16}) {
    const Tensor half = Upload16(all, t);
    Tensor f = Tensor::Empty(half.shape(), DType::kF32, kGpu);
    cuda::Cast(half, f);
    Tensor back = Tensor::Empty(half.shape(), t, kGpu);
    cuda::Cast(f, back);
    const std::vector<float> wide = DownloadF32(f);
    const std::vector<uint16_t> again = Download16(back);
    for (uint32_t h = 0; h < 0x10000; ++h) {
      const float want = HostFrom(t, all[h]);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(wide[h])) << DTypeName(t) << " 0x" << std::hex << h;
        continue;
      }
      ASSERT_EQ(FloatBits(wide[h]), FloatBits(want)) << DTypeName(t) << " 0x" << std::hex << h;
      ASSERT_EQ(again[h], all[h]) << DTypeName(t) << " round trip of 0x" << std::hex << h;
    }
  }
}

TEST(CastGPU, HalfToHalfAndSameType) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
  for (const DType from : {DType::kF16, DType::kBF16}) {
    const DType to = from == DType::kF16 ? DType::kBF16 : DType::kF16;
    const Tensor src = Upload16(all, from);
    Tensor dst = Tensor::Empty(src.shape(), to, kGpu);
    cuda::Cast(src, dst);
    const std::vector<uint16_t> got = Download16(dst);
    for (uint32_t h = 0; h < 0x10000; ++h) {
      const float v = HostFrom(from, all[h]);  // exact in f32, so one rounding
      if (std::isnan(v)) continue;
      ASSERT_EQ(got[h], HostTo(to, v))
          << DTypeName(from) << " 0x" << std::hex << h << " to " << DTypeName(to);
    }
    // Same type: a copy.
    Tensor same = Tensor::Empty(src.shape(), from, kGpu);
    cuda::Cast(src, same);
    EXPECT_EQ(Download16(same), all) << DTypeName(from);
  }
  // Mismatched sizes and f64 are refused.
  Tensor a = Tensor::Zeros(Shape{4}, DType::kF32, kGpu);
  Tensor b = Tensor::Empty(Shape{5}, DType::kF16, kGpu);
  EXPECT_THROW(cuda::Cast(a, b), Error);
  Tensor d = Tensor::Zeros(Shape{4}, DType::kF64, kGpu);
  EXPECT_THROW(cuda::Cast(d, a), Error);
}

TEST(AddCastGPU, AddsHalfAndF32IntoF32) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const int64_t n = 70003;
  const Tensor base = RandomTensor(Shape{n}, 31, -2, 2, DType::kF32);
  const Tensor add = RandomTensor(Shape{n}, 32, -2, 2, DType::kF32);
  std::vector<float> b(n), a(n);
  for (int64_t i = 0; i < n; ++i) {
    b[i] = static_cast<float>(base.At(i));
    a[i] = static_cast<float>(add.At(i));
  }
  for (const DType t : {DType::kF16, DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(t));
    Tensor dst = UploadF32(b);
    std::vector<float> src_value(n);
    Tensor src;
    if (t == DType::kF32) {
      src_value = a;
      src = UploadF32(a);
    } else {
      std::vector<uint16_t> bits(n);
      for (int64_t i = 0; i < n; ++i) {
        bits[i] = HostTo(t, a[i]);
        src_value[i] = HostFrom(t, bits[i]);
      }
      src = Upload16(bits, t);
    }
    cuda::AddCast(src, dst);
    cuda::AddCast(src, dst);  // adds, not overwrites
    const std::vector<float> got = DownloadF32(dst);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[i], (b[i] + src_value[i]) + src_value[i]) << "element " << i;
    }
  }
  Tensor half_dst = Tensor::Zeros(Shape{3}, DType::kF16, kGpu);
  EXPECT_THROW(cuda::AddCast(Tensor::Zeros(Shape{3}, DType::kF32, kGpu), half_dst), Error);
}

// Gradients of many sizes: over a chunk (16384), more tensors than one
// launch's table (110).
std::vector<int64_t> UnscaleSizes() {
  std::vector<int64_t> sizes = {1, 7, 16384, 70001, 3};
  for (int i = 0; i < 130; ++i) sizes.push_back(1 + (i * 53) % 257);
  return sizes;
}

struct GradSet {
  std::vector<std::vector<float>> host;
  std::vector<Tensor> gpu;
  explicit GradSet(const std::vector<int64_t>& sizes) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      const Tensor r = RandomTensor(Shape{sizes[i]}, 400 + i, -1000, 1000, DType::kF32);
      std::vector<float> v(sizes[i]);
      for (int64_t k = 0; k < sizes[i]; ++k) v[k] = static_cast<float>(r.At(k));
      host.push_back(v);
    }
  }
  void Upload() {
    gpu.clear();
    for (const auto& v : host) gpu.push_back(UploadF32(v));
  }
  std::vector<Tensor*> Pointers() {
    std::vector<Tensor*> p;
    for (Tensor& t : gpu) p.push_back(&t);
    return p;
  }
  // Every element (finite or not) is the host value times inv_scale.
  void ExpectScaled(float inv_scale) const {
    for (size_t i = 0; i < gpu.size(); ++i) {
      const std::vector<float> got = DownloadF32(gpu[i]);
      for (size_t k = 0; k < got.size(); ++k) {
        const float want = host[i][k] * inv_scale;
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got[k])) << "tensor " << i << " element " << k;
        } else {
          ASSERT_EQ(got[k], want) << "tensor " << i << " element " << k << " of " << got.size();
        }
      }
    }
  }
};

TEST(UnscaleGPU, FiniteGradientsAreScaledExactly) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  for (const float inv_scale : {1.0f / 65536, 0.3f, 1.0f}) {
    SCOPED_TRACE(StrCat("inv_scale ", inv_scale));
    GradSet g(UnscaleSizes());
    g.Upload();
    EXPECT_FALSE(cuda::UnscaleAndFindNonFinite(g.Pointers(), inv_scale));
    g.ExpectScaled(inv_scale);
  }
  EXPECT_FALSE(cuda::UnscaleAndFindNonFinite({}, 0.5f));
}

TEST(UnscaleGPU, FindsInfAndNanAnywhere) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const std::vector<int64_t> sizes = UnscaleSizes();
  struct Where {
    size_t tensor;
    int64_t element;
  };
  // The first element; beyond the first chunk of a tensor; the last element
  // of a tensor in the second launch (tensor index > 110).
  const std::vector<Where> places = {
      {0, 0}, {3, 70000}, {3, 16384}, {2, 16383}, {sizes.size() - 1, sizes.back() - 1}, {120, 0}};
  const float inv_scale = 1.0f / 1024;
  for (const Where& w : places) {
    for (const float bad : {INFINITY, -INFINITY, NAN}) {
      SCOPED_TRACE(StrCat(bad, " in tensor ", w.tensor, " element ", w.element));
      GradSet g(sizes);
      g.host[w.tensor][w.element] = bad;
      g.Upload();
      EXPECT_TRUE(cuda::UnscaleAndFindNonFinite(g.Pointers(), inv_scale));
      // PyTorch's semantics: everything is multiplied even so.
      g.ExpectScaled(inv_scale);
      // The flag does not stick: the same (finite) gradients again are clean.
      g.host[w.tensor][w.element] = 1.0f;
      g.Upload();
      EXPECT_FALSE(cuda::UnscaleAndFindNonFinite(g.Pointers(), inv_scale));
    }
  }
  Tensor host = Tensor::Zeros(Shape{3});
  EXPECT_THROW(cuda::UnscaleAndFindNonFinite({&host}, 1.0f), Error);
  Tensor half = Tensor::Zeros(Shape{3}, DType::kF16, kGpu);
  EXPECT_THROW(cuda::UnscaleAndFindNonFinite({&half}, 1.0f), Error);
}

TEST(AxpyHalfGPU, MatchesHostRounding) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // alpha * x is exact in f32 for a half x and alpha = -0.75, so the sum is
  // rounded once to f32 and once to the type on both sides: bitwise equal.
  const float alpha = -0.75f;
  for (const DType t : {DType::kF16, DType::kBF16}) {
    for (const int64_t n : {int64_t{1}, int64_t{1001}, (int64_t{1} << 16) + 3}) {
      SCOPED_TRACE(StrCat(DTypeName(t), " n ", n));
      const Tensor xr = RandomTensor(Shape{n}, 61, -8, 8, DType::kF32);
      const Tensor yr = RandomTensor(Shape{n}, 62, -8, 8, DType::kF32);
      std::vector<uint16_t> xb(n), yb(n);
      for (int64_t i = 0; i < n; ++i) {
        xb[i] = HostTo(t, static_cast<float>(xr.At(i)));
        yb[i] = HostTo(t, static_cast<float>(yr.At(i)));
      }
      const Tensor x = Upload16(xb, t);
      Tensor y = Upload16(yb, t);
      cuda::Axpy(alpha, x, y);
      const std::vector<uint16_t> got = Download16(y);
      for (int64_t i = 0; i < n; ++i) {
        const float want = HostFrom(t, yb[i]) + alpha * HostFrom(t, xb[i]);
        ASSERT_EQ(got[i], HostTo(t, want)) << "element " << i;
      }
    }
  }
  // x and y of different types are refused.
  Tensor y32 = Tensor::Zeros(Shape{4}, DType::kF32, kGpu);
  EXPECT_THROW(cuda::Axpy(1.0f, Tensor::Zeros(Shape{4}, DType::kF16, kGpu), y32), Error);
}

}  // namespace
}  // namespace cnnflow
