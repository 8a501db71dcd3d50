#include "ops/cpu/bf16_layout.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace cnnflow::cpu {

namespace {

#define CNNFLOW_AVX512_BF16 __attribute__((target("avx512f,avx512bf16,avx512vl,avx512bw")))

// A function, not a lambda: a lambda does not take its caller's target
// attribute, and a build without -march=native then cannot inline the cast.
CNNFLOW_AVX512_BF16 inline __m512d AsPd(__m512 v) { return _mm512_castps_pd(v); }

// r[i] <- column i of the 16 x 16 matrix whose rows are r[0..15].
CNNFLOW_AVX512_BF16 inline void Transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(AsPd(t[i]), AsPd(t[i + 2])));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(AsPd(t[i]), AsPd(t[i + 2])));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(AsPd(t[i + 1]), AsPd(t[i + 3])));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(AsPd(t[i + 1]), AsPd(t[i + 3])));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

inline __mmask16 FirstLanes(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }

CNNFLOW_AVX512_BF16 inline __m256i Bf16Of(__m512 v) {
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
}

// 16 bf16 values widened to f32 (exact: the low 16 bits zero).
CNNFLOW_AVX512_BF16 inline __m512 F32Of(__m256i v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

}  // namespace

CNNFLOW_AVX512_BF16 void FromBf16(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(dst + i, F32Of(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
  if (i < n) {
    const __mmask16 m = FirstLanes(n - i);
    _mm512_mask_storeu_ps(dst + i, m, F32Of(_mm256_maskz_loadu_epi16(m, src + i)));
  }
}

CNNFLOW_AVX512_BF16 void RoundToBf16(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, F32Of(Bf16Of(_mm512_loadu_ps(src + i))));
  if (i < n) {
    const __mmask16 m = FirstLanes(n - i);
    _mm512_mask_storeu_ps(dst + i, m, F32Of(Bf16Of(_mm512_maskz_loadu_ps(m, src + i))));
  }
}

CNNFLOW_AVX512_BF16 void ToBf16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), Bf16Of(_mm512_loadu_ps(src + i)));
  }
  if (i < n) {
    const __mmask16 m = FirstLanes(n - i);
    _mm256_mask_storeu_epi16(dst + i, m, Bf16Of(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

float SumBf16(const uint16_t* v, int64_t n) {
  auto value = [](uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  float lane[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int l = 0; l < 16; ++l) lane[l] += value(v[i + l]);
  }
  float sum = 0;
  for (; i < n; ++i) sum += value(v[i]);
  for (float l : lane) sum += l;
  return sum;
}

// 16 x 16 tiles: 16 channel rows of 16 positions in, 16 position rows of
// 16 channels out; the tails masked.
CNNFLOW_AVX512_BF16 void NchwToNhwcBf16(const float* src, uint16_t* dst, int64_t n, int64_t c,
                                        int64_t p) {
  for (int64_t s = 0; s < n; ++s) {
    const float* x = src + s * c * p;
    uint16_t* y = dst + s * c * p;
    for (int64_t p0 = 0; p0 < p; p0 += 16) {
      const int64_t pn = std::min<int64_t>(16, p - p0);
      for (int64_t c0 = 0; c0 < c; c0 += 16) {
        const int64_t cn = std::min<int64_t>(16, c - c0);
        __m512 r[16];
        for (int64_t i = 0; i < 16; ++i) {
          r[i] = i < cn ? _mm512_maskz_loadu_ps(FirstLanes(pn), x + (c0 + i) * p + p0)
                        : _mm512_setzero_ps();
        }
        Transpose16(r);
        for (int64_t j = 0; j < pn; ++j) {
          _mm256_mask_storeu_epi16(y + (p0 + j) * c + c0, FirstLanes(cn), Bf16Of(r[j]));
        }
      }
    }
  }
}

CNNFLOW_AVX512_BF16 void NhwcToNchw(const float* src, float* dst, int64_t n, int64_t c, int64_t p) {
  for (int64_t s = 0; s < n; ++s) {
    const float* x = src + s * c * p;
    float* y = dst + s * c * p;
    for (int64_t c0 = 0; c0 < c; c0 += 16) {
      const int64_t cn = std::min<int64_t>(16, c - c0);
      for (int64_t p0 = 0; p0 < p; p0 += 16) {
        const int64_t pn = std::min<int64_t>(16, p - p0);
        __m512 r[16];
        for (int64_t i = 0; i < 16; ++i) {
          r[i] = i < pn ? _mm512_maskz_loadu_ps(FirstLanes(cn), x + (p0 + i) * c + c0)
                        : _mm512_setzero_ps();
        }
        Transpose16(r);
        for (int64_t j = 0; j < cn; ++j) {
          _mm512_mask_storeu_ps(y + (c0 + j) * p + p0, FirstLanes(pn), r[j]);
        }
      }
    }
  }
}

}  // namespace cnnflow::cpu
