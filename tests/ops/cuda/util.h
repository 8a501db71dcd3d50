// What the CUDA kernel tests share: the GPU, GPU labels, the printout of a
// GPU-vs-CPU comparison, host references of f32 <-> f16/bf16 rounding
// (written from the formats' definitions, independent of CUDA's
// conversions), and host bits <-> GPU tensors.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ops/device.h"
#include "ops/tensor.h"
#include "tests/ops/gpu_check.h"

namespace cnnflow::testing {

inline const Device kGpu = Device::Cuda(0);

// Prints every figure, so a failure says which part is off.
inline std::string Describe(const GpuCpuComparison& c) {
  return StrCat("output ", c.output, ", input grad ", c.input_grad, ", param grad ", c.param_grad,
                " (worst: '", c.worst_param, "'), buffers ", c.buffer);
}

// int64 labels copied into GPU memory (the GPU loss reads them there).
struct DeviceLabels {
  explicit DeviceLabels(const std::vector<int64_t>& host)
      : labels(LabelTensor(host.data(), static_cast<int64_t>(host.size()), kGpu)) {}
  const int64_t* get() const { return labels.data<int64_t>(); }
  Tensor labels;
};

// Host references of f32 <-> f16 / bf16 (round to nearest even), written
// from the formats' definitions, independent of CUDA's conversions.
inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t HostToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);  // stays a (quiet) NaN
  // Add just under half an ulp, plus one when the kept part is odd: ties to even.
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
inline float HostFromBf16(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t HostToF16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7fffffff;
  if (a > 0x7f800000) return sign | 0x7e00;   // NaN
  if (a >= 0x477ff000) return sign | 0x7c00;  // >= 65520 (half-way above 65504): inf
  if (a < 0x38800000) {
    // Below 2^-14: a multiple of 2^-24 (subnormal; 0x400 is the smallest
    // normal, whose encoding follows on). x * 2^24 is exact; nearbyint
    // rounds half to even in the default rounding mode.
    const float units = std::nearbyint(BitsFloat(a) * 16777216.0f);
    return sign | static_cast<uint16_t>(units);
  }
  const uint32_t exp = (a >> 23) - 127 + 15, mant = a & 0x7fffff;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // a carry moves into the exponent
  return sign | static_cast<uint16_t>(h);
}
inline float HostFromF16(uint16_t h) {
  const float sign = (h & 0x8000) ? -1.f : 1.f;
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -24);
  if (exp == 31) return mant ? std::numeric_limits<float>::quiet_NaN() : sign * INFINITY;
  return sign * std::ldexp(static_cast<float>(1024 + mant), exp - 25);
}

inline uint16_t HostTo(DType t, float f) { return t == DType::kF16 ? HostToF16(f) : HostToBf16(f); }
inline float HostFrom(DType t, uint16_t h) {
  return t == DType::kF16 ? HostFromF16(h) : HostFromBf16(h);
}

// Host bits <-> GPU tensors of any 2-byte or 4-byte type.
inline Tensor Upload16(const std::vector<uint16_t>& bits, DType t) {
  Tensor g = Tensor::Empty(Shape{static_cast<int64_t>(bits.size())}, t, kGpu);
  CopyBytes(kGpu, g.raw_data(), Device::Cpu(), bits.data(), bits.size() * 2);
  return g;
}
inline std::vector<uint16_t> Download16(const Tensor& g) {
  std::vector<uint16_t> bits(static_cast<size_t>(g.numel()));
  CopyBytes(Device::Cpu(), bits.data(), g.device(), g.raw_data(), bits.size() * 2);
  return bits;
}
inline Tensor UploadF32(const std::vector<float>& v) {
  Tensor g = Tensor::Empty(Shape{static_cast<int64_t>(v.size())}, DType::kF32, kGpu);
  CopyBytes(kGpu, g.raw_data(), Device::Cpu(), v.data(), v.size() * 4);
  return g;
}
inline std::vector<float> DownloadF32(const Tensor& g) {
  std::vector<float> v(static_cast<size_t>(g.numel()));
  CopyBytes(Device::Cpu(), v.data(), g.device(), g.raw_data(), v.size() * 4);
  return v;
}

// f32 values that exercise rounding: ties, subnormals, overflow, specials,

}  // namespace cnnflow::testing
