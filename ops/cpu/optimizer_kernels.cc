#include "ops/cpu/optimizer_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "ops/cpu/isa.h"
#include "ops/cpu/parallel.h"

namespace cnnflow::cpu {
namespace {

// Elements per parallel task: the update is memory bound, so small
// parameters (biases, small convolutions) run on the calling thread.
constexpr int64_t kGrain = 1 << 15;

// One range of the SGD update; the flags are template parameters so each
// variant is a branch-free loop the compiler vectorises.
template <typename T, bool kMomentum, bool kFirst, bool kNesterov>
void SgdRange(T* __restrict p, const T* __restrict grad, T* __restrict buf, int64_t begin,
              int64_t end, T wd, T mu, T one_minus_d, T neg_lr) {
  for (int64_t k = begin; k < end; ++k) {
    T g = grad[k] + wd * p[k];  // wd 0: exactly grad
    if constexpr (kMomentum) {
      T b;
      if constexpr (kFirst) {
        b = g;  // torch: buf = clone(grad) at the first step
      } else {
        b = buf[k] * mu + one_minus_d * g;
      }
      buf[k] = b;
      g = kNesterov ? g + mu * b : b;
    }
    p[k] = p[k] + neg_lr * g;
  }
}

// x[i] = sqrt(x[i]), n values. Intrinsics because GCC does not vectorise
// std::sqrt unless -fno-math-errno is set; one function per ISA, compiled
// for it whatever -march says, taken where the CPU has it.
template <typename T>
void SqrtScalar(T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = std::sqrt(x[i]);
}

__attribute__((target("avx2"))) void SqrtAvx2(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) x[i] = std::sqrt(x[i]);
}

__attribute__((target("avx2"))) void SqrtAvx2(double* x, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) _mm256_storeu_pd(x + i, _mm256_sqrt_pd(_mm256_loadu_pd(x + i)));
  for (; i < n; ++i) x[i] = std::sqrt(x[i]);
}

// The masked forms: _mm512_sqrt_ps trips GCC 12's -Wmaybe-uninitialized.
__attribute__((target("avx512f"))) void SqrtAvx512(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 a = _mm512_loadu_ps(x + i);
    _mm512_storeu_ps(x + i, _mm512_mask_sqrt_ps(a, static_cast<__mmask16>(0xFFFF), a));
  }
  for (; i < n; ++i) x[i] = std::sqrt(x[i]);
}

__attribute__((target("avx512f"))) void SqrtAvx512(double* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d a = _mm512_loadu_pd(x + i);
    _mm512_storeu_pd(x + i, _mm512_mask_sqrt_pd(a, static_cast<__mmask8>(0xFF), a));
  }
  for (; i < n; ++i) x[i] = std::sqrt(x[i]);
}

template <typename T>
using SqrtFn = void (*)(T*, int64_t);

template <typename T>
SqrtFn<T> SqrtFor(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return static_cast<SqrtFn<T>>(SqrtAvx512);
    case Isa::kAvx2:
      return static_cast<SqrtFn<T>>(SqrtAvx2);
    default:
      return SqrtScalar<T>;
  }
}

// One range of the Adam update, in blocks: moments, then sqrt, then the
// parameter, each a loop the compiler vectorises.
template <typename T>
void AdamRange(T* __restrict p, const T* __restrict grad, T* __restrict m, T* __restrict v,
               int64_t begin, int64_t end, T decay, T l2, T one_minus_b1, T b2, T one_minus_b2,
               T eps, T neg_step, T bc2_sqrt, SqrtFn<T> sqrt_in_place) {
  constexpr int64_t kBlock = 512;
  alignas(64) T root[kBlock];
  for (int64_t b0 = begin; b0 < end; b0 += kBlock) {
    const int64_t len = std::min(kBlock, end - b0);
    T* __restrict pb = p + b0;
    const T* __restrict gb = grad + b0;
    T* __restrict mb = m + b0;
    T* __restrict vb = v + b0;
    for (int64_t k = 0; k < len; ++k) {
      const T pk = pb[k] * decay;                  // AdamW: p *= 1 - lr * wd (decay is 1 for Adam)
      const T g = gb[k] + l2 * pk;                 // Adam: L2 on the grad (l2 is 0 for AdamW)
      mb[k] = mb[k] + one_minus_b1 * (g - mb[k]);  // torch: exp_avg.lerp_(grad, 1 - beta1)
      const T vk = vb[k] * b2 + one_minus_b2 * g * g;
      vb[k] = vk;
      root[k] = vk;
    }
    sqrt_in_place(root, len);
    for (int64_t k = 0; k < len; ++k) {
      const T denom = root[k] / bc2_sqrt + eps;
      pb[k] = pb[k] * decay + neg_step * (mb[k] / denom);
    }
  }
}

}  // namespace

template <typename T>
void SgdUpdate(T* p, const T* grad, T* buf, bool first, int64_t n, const SgdScalars& s, double lr) {
  const T wd = static_cast<T>(s.weight_decay);
  const T mu = static_cast<T>(s.momentum);
  const T one_minus_d = static_cast<T>(1 - s.dampening);
  const T neg_lr = static_cast<T>(-lr);
  const bool nesterov = s.nesterov;
  ParallelFor(n, kGrain, [&](int64_t begin, int64_t end) {
    auto run = [&](auto range) { range(p, grad, buf, begin, end, wd, mu, one_minus_d, neg_lr); };
    if (buf == nullptr) {
      run(SgdRange<T, false, false, false>);
    } else if (first) {
      nesterov ? run(SgdRange<T, true, true, true>) : run(SgdRange<T, true, true, false>);
    } else {
      nesterov ? run(SgdRange<T, true, false, true>) : run(SgdRange<T, true, false, false>);
    }
  });
}

template <typename T>
void AdamUpdate(T* p, const T* grad, T* m, T* v, int64_t n, const AdamScalars& s) {
  const T decay = static_cast<T>(s.decay_factor);
  const T l2 = static_cast<T>(s.l2);
  const T one_minus_b1 = static_cast<T>(1 - s.beta1);
  const T b2 = static_cast<T>(s.beta2);
  const T one_minus_b2 = static_cast<T>(1 - s.beta2);
  const T eps = static_cast<T>(s.eps);
  const T neg_step = static_cast<T>(-s.step_size);
  const T bc2_sqrt = static_cast<T>(s.bc2_sqrt);
  const SqrtFn<T> sqrt_in_place = SqrtFor<T>(MaxIsa());
  ParallelFor(n, kGrain, [&](int64_t begin, int64_t end) {
    AdamRange<T>(p, grad, m, v, begin, end, decay, l2, one_minus_b1, b2, one_minus_b2, eps,
                 neg_step, bc2_sqrt, sqrt_in_place);
  });
}

template void SgdUpdate<float>(float*, const float*, float*, bool, int64_t, const SgdScalars&,
                               double);
template void SgdUpdate<double>(double*, const double*, double*, bool, int64_t, const SgdScalars&,
                                double);
template void AdamUpdate<float>(float*, const float*, float*, float*, int64_t, const AdamScalars&);
template void AdamUpdate<double>(double*, const double*, double*, double*, int64_t,
                                 const AdamScalars&);

}  // namespace cnnflow::cpu
