// The kernels of ops/cuda/pooling_ceil.h: one thread per output value
// (forward) or per input value (backward), grid-stride.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "ops/cuda/map.cuh"
#include "ops/cuda/pooling_ceil.h"

namespace cnnflow::cuda {
namespace {

// The window geometry on the device.
struct Geo {
  int64_t h, w, oh, ow, kh, kw, sh, sw, ph, pw;
};

Geo GeoOf(const Pool2dGeometry& g) {
  return {g.in_h,     g.in_w,     g.out_h,    g.out_w, g.kernel_h,
          g.kernel_w, g.stride_h, g.stride_w, g.pad_h, g.pad_w};
}

// Output (r, c)'s window start (unclipped) and its divisor, as the CPU's
// AvgDivisor.
__device__ int64_t Divisor(const Geo& g, int64_t r, int64_t c, bool include_pad) {
  const int64_t hs = r * g.sh - g.ph, ws = c * g.sw - g.pw;
  if (include_pad) {
    const int64_t he = min(hs + g.kh, g.h + g.ph), we = min(ws + g.kw, g.w + g.pw);
    return (he - hs) * (we - ws);
  }
  const int64_t he = min(hs + g.kh, g.h), we = min(ws + g.kw, g.w);
  return (he - max(hs, int64_t{0})) * (we - max(ws, int64_t{0}));
}

// The outputs along one axis whose windows hold input index i: [lo, hi].
__device__ void Covering(int64_t i, int64_t k, int64_t s, int64_t p, int64_t n_out, int64_t* lo,
                         int64_t* hi) {
  const int64_t first = i + p - k + 1;
  *lo = first <= 0 ? 0 : (first + s - 1) / s;
  *hi = min((i + p) / s, n_out - 1);
}

template <typename T>
struct MaxForward {
  const T* x;
  T* y;
  int64_t* arg;
  Geo g;
  __device__ void Scalar(int64_t i) const {
    const int64_t c = i % g.ow, r = (i / g.ow) % g.oh, plane = i / (g.ow * g.oh);
    const int64_t hs0 = r * g.sh - g.ph, ws0 = c * g.sw - g.pw;
    const int64_t hs = max(hs0, int64_t{0}), he = min(hs0 + g.kh, g.h);
    const int64_t ws = max(ws0, int64_t{0}), we = min(ws0 + g.kw, g.w);
    const T* xp = x + plane * g.h * g.w;
    float best = -INFINITY;
    int64_t at = hs * g.w + ws;
    for (int64_t a = hs; a < he; ++a) {
      for (int64_t b = ws; b < we; ++b) {
        const float v = static_cast<float>(xp[a * g.w + b]);
        if (v > best || v != v) {  // PyTorch's: a NaN always wins
          best = v;
          at = a * g.w + b;
        }
      }
    }
    y[i] = static_cast<T>(best);
    arg[i] = at;
  }
  CNNFLOW_VECTOR_BY_SCALARS
};

template <typename T>
struct MaxBackward {
  const T* dy;
  const int64_t* arg;
  T* dx;
  Geo g;
  __device__ void Scalar(int64_t i) const {
    const int64_t b = i % g.w, a = (i / g.w) % g.h, plane = i / (g.w * g.h);
    int64_t r0, r1, c0, c1;
    Covering(a, g.kh, g.sh, g.ph, g.oh, &r0, &r1);
    Covering(b, g.kw, g.sw, g.pw, g.ow, &c0, &c1);
    const int64_t cell = a * g.w + b, base = plane * g.oh * g.ow;
    float s = 0;
    for (int64_t r = r0; r <= r1; ++r) {
      for (int64_t c = c0; c <= c1; ++c) {
        const int64_t o = base + r * g.ow + c;
        if (arg[o] == cell) s += static_cast<float>(dy[o]);
      }
    }
    dx[i] = static_cast<T>(s);
  }
  CNNFLOW_VECTOR_BY_SCALARS
};

template <typename T>
struct AvgForward {
  const T* x;
  T* y;
  Geo g;
  bool include_pad;
  __device__ void Scalar(int64_t i) const {
    const int64_t c = i % g.ow, r = (i / g.ow) % g.oh, plane = i / (g.ow * g.oh);
    const int64_t hs0 = r * g.sh - g.ph, ws0 = c * g.sw - g.pw;
    const int64_t hs = max(hs0, int64_t{0}), he = min(hs0 + g.kh, g.h);
    const int64_t ws = max(ws0, int64_t{0}), we = min(ws0 + g.kw, g.w);
    const T* xp = x + plane * g.h * g.w;
    float s = 0;
    for (int64_t a = hs; a < he; ++a)
      for (int64_t b = ws; b < we; ++b) s += static_cast<float>(xp[a * g.w + b]);
    y[i] = static_cast<T>(s / static_cast<float>(Divisor(g, r, c, include_pad)));
  }
  CNNFLOW_VECTOR_BY_SCALARS
};

template <typename T>
struct AvgBackward {
  const T* dy;
  T* dx;
  Geo g;
  bool include_pad;
  __device__ void Scalar(int64_t i) const {
    const int64_t b = i % g.w, a = (i / g.w) % g.h, plane = i / (g.w * g.h);
    int64_t r0, r1, c0, c1;
    Covering(a, g.kh, g.sh, g.ph, g.oh, &r0, &r1);
    Covering(b, g.kw, g.sw, g.pw, g.ow, &c0, &c1);
    const int64_t base = plane * g.oh * g.ow;
    float s = 0;
    for (int64_t r = r0; r <= r1; ++r) {
      for (int64_t c = c0; c <= c1; ++c) {
        s += static_cast<float>(dy[base + r * g.ow + c]) /
             static_cast<float>(Divisor(g, r, c, include_pad));
      }
    }
    dx[i] = static_cast<T>(s);
  }
  CNNFLOW_VECTOR_BY_SCALARS
};

void CheckPair(const Tensor& a, const Tensor& b, const char* what) {
  CheckGpuFloat(a, what);
  CheckGpuFloat(b, what);
  CheckSameGpu(a, b, what);
  CheckSameType(a, b, what);
}

cudaStream_t StreamOf(const Tensor& t) { return CudaContext::For(t.device()).stream(); }

}  // namespace

void CeilMaxPoolForward(const Pool2dGeometry& g, const Tensor& x, Tensor& y, Tensor& argmax) {
  CheckPair(x, y, "maxpool2d (ceil_mode)");
  if (!argmax.defined() || argmax.numel() != y.numel() || argmax.device() != y.device())
    argmax = Tensor::Empty(y.shape(), DType::kI64, y.device());
  DispatchGpuFloat(x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const MaxForward<T> op{static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()),
                           argmax.data<int64_t>(), GeoOf(g)};
    LaunchMap(op, y.numel(), false, StreamOf(x));
  });
}

void CeilMaxPoolBackward(const Pool2dGeometry& g, const Tensor& dy, const Tensor& argmax,
                         Tensor& dx) {
  CheckPair(dy, dx, "maxpool2d (ceil_mode) gradient");
  CNNFLOW_ENFORCE(argmax.numel() == dy.numel(), "maxpool2d (ceil_mode): backward before forward");
  DispatchGpuFloat(dy.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const MaxBackward<T> op{static_cast<const T*>(dy.raw_data()), argmax.data<int64_t>(),
                            static_cast<T*>(dx.raw_data()), GeoOf(g)};
    LaunchMap(op, dx.numel(), false, StreamOf(dy));
  });
}

void CeilAvgPoolForward(const Pool2dGeometry& g, bool include_pad, const Tensor& x, Tensor& y) {
  CheckPair(x, y, "avgpool2d (ceil_mode)");
  DispatchGpuFloat(x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const AvgForward<T> op{static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()),
                           GeoOf(g), include_pad};
    LaunchMap(op, y.numel(), false, StreamOf(x));
  });
}

void CeilAvgPoolBackward(const Pool2dGeometry& g, bool include_pad, const Tensor& dy, Tensor& dx) {
  CheckPair(dy, dx, "avgpool2d (ceil_mode) gradient");
  DispatchGpuFloat(dy.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const AvgBackward<T> op{static_cast<const T*>(dy.raw_data()), static_cast<T*>(dx.raw_data()),
                            GeoOf(g), include_pad};
    LaunchMap(op, dx.numel(), false, StreamOf(dy));
  });
}

}  // namespace cnnflow::cuda
