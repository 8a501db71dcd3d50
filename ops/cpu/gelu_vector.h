// The erf GELU (torch.nn.GELU) over rows of f32, 16 lanes at a time (GCC
// vector extensions, which any x86 ISA lowers), for layers that apply it
// inside their own loops (batchnorm's fused GELU): a pass over memory fewer
// than a gelu layer of its own, forward and backward.
//
// erf is Abramowitz and Stegun's 7.1.26 (|error| < 1.5e-7), as PyTorch's
// vectorised CPU erf; exp is Cephes' expf (relative error < 2e-7).
#pragma once

#include <cstdint>
#include <cstring>

namespace cnnflow::cpu {

using Float16 = float __attribute__((vector_size(64)));
using Int16 = int32_t __attribute__((vector_size(64)));

namespace gelu_detail {

inline Float16 Splat(float v) { return Float16{} + v; }

// exp(x) for x <= 0; 2^-126 below -87.
inline Float16 ExpNonPositive(Float16 x) {
  const Float16 lo = Splat(-87.0f);
  x = x < lo ? lo : x;
  const Float16 fx = x * 1.44269504088896341f + 0.5f;
  Float16 n = __builtin_convertvector(__builtin_convertvector(fx, Int16), Float16);
  n = n > fx ? n - 1.0f : n;  // floor: the conversion truncates toward zero
  const Float16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
  Float16 p = Splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const Float16 y = p * r * r + r + 1.0f;
  const Int16 scale = (__builtin_convertvector(n, Int16) + 127) << 23;  // 2^n
  return y * __builtin_bit_cast(Float16, scale);
}

// Phi(u), the standard normal CDF, and exp(-u^2 / 2).
struct CdfAndExp {
  Float16 cdf, e;
};
inline CdfAndExp NormalCdf(Float16 u) {
  const Float16 w = (u < 0.0f ? -u : u) * 0.70710678118654752f;  // |u| / sqrt(2)
  const Float16 t = 1.0f / (w * 0.3275911f + 1.0f);
  const Float16 poly =
      t * (0.254829592f +
           t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  const Float16 e = ExpNonPositive(-w * w);
  const Float16 half_tail = 0.5f * poly * e;  // (1 - erf(w)) / 2, without cancellation
  return {u < 0.0f ? half_tail : 1.0f - half_tail, e};
}

// fn(i, load, store) over [0, n): whole vectors (fixed-size copies, which
// compile to plain vector moves), then the tail through a zero-padded one.
inline Float16 LoadFull(const float* p) {
  Float16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void StoreFull(const Float16& v, float* p) { std::memcpy(p, &v, sizeof(v)); }
template <typename Fn>
inline void ForVectors(int64_t n, Fn&& fn) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) fn(i, LoadFull, StoreFull);
  if (i == n) return;
  const size_t tail = static_cast<size_t>(n - i) * sizeof(float);
  fn(
      i,
      [tail](const float* p) {
        Float16 v = {};
        std::memcpy(&v, p, tail);
        return v;
      },
      [tail](const Float16& v, float* p) { std::memcpy(p, &v, tail); });
}

}  // namespace gelu_detail

// y[i] = gelu(y[i]) = y[i] * Phi(y[i]), in place.
inline void GeluErfInPlace(float* y, int64_t n) {
  using namespace gelu_detail;
  ForVectors(n, [&](int64_t i, auto load, auto store) {
    const Float16 u = load(y + i);
    store(u * NormalCdf(u).cdf, y + i);
  });
}

// out[i] = g[i] * gelu'(u[i]) = g[i] * (Phi(u) + u phi(u)); out may be u.
inline void GeluErfGrad(const float* u, const float* g, float* out, int64_t n) {
  using namespace gelu_detail;
  ForVectors(n, [&](int64_t i, auto load, auto store) {
    const Float16 v = load(u + i);
    const CdfAndExp c = NormalCdf(v);
    store(load(g + i) * (c.cdf + v * c.e * 0.39894228040143267794f), out + i);
  });
}

}  // namespace cnnflow::cpu
