// Our own conversions between the layers' f32 NCHW tensors and the bf16 /
// NHWC operands of oneDNN's bf16 kernels: vectorised transposes, faster
// than oneDNN 2.6.3's generic reorders (`jit:uni`) for these pairs, and the
// plain rounding. bf16 values are
// rounded to nearest even by vcvtneps2bf16, as oneDNN's own conversions:
// call them only where cpu::CpuHasAvx512Bf16().
#pragma once

#include <cstdint>

namespace cnnflow::cpu {

// dst[i] = bf16(src[i]) for i < n.
void ToBf16(const float* src, uint16_t* dst, int64_t n);
// dst[i] = src[i] widened to f32 (exact) for i < n.
void FromBf16(const uint16_t* src, float* dst, int64_t n);
// dst[i] = bf16(src[i]) as an f32 for i < n (dst may be src).
void RoundToBf16(const float* src, float* dst, int64_t n);
// The f32 sum of n bf16 values, in 16 lanes then across them (a fixed
// order: a function of n only).
float SumBf16(const uint16_t* v, int64_t n);
// src [n, C, P] f32 -> dst [n, P, C] bf16.
void NchwToNhwcBf16(const float* src, uint16_t* dst, int64_t n, int64_t c, int64_t p);
// src [n, P, C] f32 -> dst [n, C, P] f32.
void NhwcToNchw(const float* src, float* dst, int64_t n, int64_t c, int64_t p);

}  // namespace cnnflow::cpu
