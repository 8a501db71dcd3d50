#include "ops/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace cnnflow {
namespace {

TEST(Tensor, EmptyIsAlignedAndContiguous) {
  Tensor t = Tensor::Empty({3, 5, 7});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % kAlignment, 0u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.numel(), 105);
  EXPECT_EQ(t.strides(), (std::vector<int64_t>{35, 7, 1}));
}

TEST(Tensor, SliceSharesStorage) {
  Tensor t = Tensor::Zeros({4, 3});
  Tensor s = t.Slice(1, 3);
  EXPECT_EQ(s.shape(), Shape({2, 3}));
  s.Set(0, 5.0);
  EXPECT_EQ(t.At(3), 5.0);
}

TEST(Tensor, ReshapeChecksCount) {
  Tensor t = Tensor::Zeros({4, 3});
  EXPECT_EQ(t.Reshape({12}).shape(), Shape({12}));
  EXPECT_THROW(t.Reshape({5}), Error);
}

TEST(Tensor, PoolReusesReleasedBlocks) {
  MemoryPool& pool = PoolFor(Device::Cpu());
  void* first = nullptr;
  { first = Tensor::Empty({1000}).raw_data(); }
  const size_t reserved = pool.bytes_reserved();
  void* second = Tensor::Empty({1000}).raw_data();
  EXPECT_EQ(first, second);
  EXPECT_EQ(pool.bytes_reserved(), reserved);
}

// A request takes the smallest free block up to 1.5x its size class (an
// evaluation batch of 1000 reusing the training batch of 1024's blocks),
// counted at the block's size until it comes back; a smaller one does not.
TEST(Tensor, PoolServesASmallerTensorFromAFreeBlockUpToHalfAsLargeAgain) {
  MemoryPool& pool = PoolFor(Device::Cpu());
  constexpr int64_t kMiB = int64_t{1} << 20;
  void* large = nullptr;
  { large = Tensor::Empty({61 * kMiB / 4}).raw_data(); }  // 61 MiB, back on its free list
  const size_t reserved = pool.bytes_reserved(), in_use = pool.bytes_in_use();
  {
    Tensor smaller = Tensor::Empty({59 * kMiB / 4 + 3});  // class 60 MiB
    EXPECT_EQ(smaller.raw_data(), large);
    EXPECT_EQ(pool.bytes_reserved(), reserved);
    EXPECT_EQ(pool.bytes_in_use(), in_use + 61 * kMiB);
  }
  EXPECT_EQ(pool.bytes_in_use(), in_use);
  Tensor much_smaller = Tensor::Empty({40 * kMiB / 4});  // 61 > 1.5 x 40: a block of its own
  EXPECT_NE(much_smaller.raw_data(), large);
  EXPECT_EQ(pool.bytes_reserved(), reserved + 40 * kMiB);
  Tensor again = Tensor::Empty({61 * kMiB / 4});
  EXPECT_EQ(again.raw_data(), large);
}

TEST(Tensor, CastRoundTrip) {
  Tensor t = Tensor::Full({3}, 1.5);
  Tensor d = t.Cast(DType::kF64);
  EXPECT_EQ(d.dtype(), DType::kF64);
  EXPECT_EQ(d.At(2), 1.5);
}

TEST(Tensor, LabelsAreInt64) {
  const int64_t labels[] = {3, 0, (int64_t{1} << 40) + 7, 9};  // beyond f32's exact range
  Tensor t = LabelTensor(labels, 4, Device::Cpu());
  EXPECT_EQ(t.dtype(), DType::kI64);
  EXPECT_EQ(t.nbytes(), 4 * sizeof(int64_t));
  EXPECT_STREQ(DTypeName(t.dtype()), "i64");
  EXPECT_STREQ(SafetensorsName(t.dtype()), "I64");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(t.data<int64_t>()[i], labels[i]);
  EXPECT_EQ(t.At(0), 3.0);
  t.Set(1, 5);
  EXPECT_EQ(t.data<int64_t>()[1], 5);
  EXPECT_THROW(t.data<float>(), Error);
}

TEST(Device, ParseAndPrint) {
  EXPECT_EQ(Device::Parse("cpu:1"), Device::Cpu(1));
  EXPECT_EQ(Device::Parse("cuda:0").ToString(), "cuda:0");
  EXPECT_THROW(Device::Parse("tpu:0"), ConfigError);
  EXPECT_THROW(Device::Parse("cpu:x"), ConfigError);
}

TEST(DeviceGPU, AllocateAndCopyRoundTrip) {
  if (!CudaAvailable())
    GTEST_SKIP() << "no GPU found (CUDA built: " << CudaDeviceCount() << " devices)";
  Tensor h = Tensor::Full({257}, 3.25);
  Tensor g = h.To(Device::Cuda(0));
  EXPECT_EQ(g.device(), Device::Cuda(0));
  Tensor back = g.To(Device::Cpu());
  for (int64_t i = 0; i < back.numel(); ++i) EXPECT_EQ(back.At(i), 3.25);
  g.Zero();
  EXPECT_EQ(g.To(Device::Cpu()).At(10), 0.0);
}

TEST(Tensor, HalfValuesReadExactlyAndCastToF32) {
  // f16: 1, -2.5, the smallest subnormal 2^-24, the largest normal 65504, +inf;
  // bf16: 1, -3.140625.
  const uint16_t f16[] = {0x3c00, 0xc100, 0x0001, 0x7bff, 0x7c00};
  Tensor h = Tensor::Empty(Shape{5}, DType::kF16);
  std::memcpy(h.raw_data(), f16, sizeof f16);
  const Tensor f = h.Cast(DType::kF32);
  EXPECT_EQ(f.At(0), 1.0);
  EXPECT_EQ(f.At(1), -2.5);
  EXPECT_EQ(f.At(2), std::ldexp(1.0, -24));
  EXPECT_EQ(f.At(3), 65504.0);
  EXPECT_TRUE(std::isinf(f.At(4)));
  const uint16_t bf16[] = {0x3f80, 0xc049};
  Tensor b = Tensor::Empty(Shape{2}, DType::kBF16);
  std::memcpy(b.raw_data(), bf16, sizeof bf16);
  EXPECT_EQ(b.At(0), 1.0);
  EXPECT_EQ(b.At(1), -3.140625);
}

}  // namespace
}  // namespace cnnflow
