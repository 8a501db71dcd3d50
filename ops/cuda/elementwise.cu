// Elementwise CUDA kernels and the layers made of them: Axpy, Scale, Cast
// and AddCast (ops/cuda/kernels.h), relu, add, flatten and dropout on a GPU
// (same semantics as ops/cpu/*.cc; dropout draws the CPU's mask bit for
// bit), and the bias helpers of the linear layer (ops/cuda/elementwise.h).
// The layers run in f32 or, under mixed precision, in f16/bf16 (the dtype
// of their tensors): half values are computed in f32 and rounded once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/add.h"
#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/kernels.h"
#include "ops/dropout.h"
#include "ops/flatten.h"
#include "ops/relu.h"

namespace cnnflow {
namespace {

// ------------------------------------------------------------ checks

// A contiguous f32 tensor on a GPU, or an Error naming `what`.
void CheckGpuF32(const Tensor& t, const std::string& what) {
  if (!t.device().is_cuda()) {
    throw Error(
        StrCat(what, " is on ", t.device().ToString(), "; a CUDA kernel needs a GPU tensor"));
  }
  if (t.dtype() != DType::kF32) {
    throw Error(StrCat(what, " is ", DTypeName(t.dtype()), "; CUDA kernels take f32 only"));
  }
  CNNFLOW_ENFORCE(t.is_contiguous(), what, " ", t.shape(), " is not contiguous");
}

void CheckSameGpu(const Tensor& a, const Tensor& b, const std::string& what) {
  CNNFLOW_ENFORCE(a.device() == b.device(), what, ": tensors on ", a.device().ToString(), " and ",
                  b.device().ToString());
}

// A contiguous f32, f16 or bf16 tensor on a GPU, or an Error naming `what`.
void CheckGpuFloat(const Tensor& t, const std::string& what) {
  if (!t.device().is_cuda()) {
    throw Error(
        StrCat(what, " is on ", t.device().ToString(), "; a CUDA kernel needs a GPU tensor"));
  }
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kF16 && t.dtype() != DType::kBF16) {
    throw Error(StrCat(what, " is ", DTypeName(t.dtype()), "; CUDA kernels take f32, f16 or bf16"));
  }
  CNNFLOW_ENFORCE(t.is_contiguous(), what, " ", t.shape(), " is not contiguous");
}

void CheckSameType(const Tensor& a, const Tensor& b, const std::string& what) {
  CNNFLOW_ENFORCE(a.dtype() == b.dtype(), what, ": ", DTypeName(a.dtype()), " and ",
                  DTypeName(b.dtype()), " tensors");
}

// Calls fn with a null pointer of the element type of f32, f16 or bf16.
template <typename Fn>
void DispatchGpuFloat(DType t, Fn&& fn) {
  switch (t) {
    case DType::kF32:
      fn(static_cast<float*>(nullptr));
      return;
    case DType::kF16:
      fn(static_cast<__half*>(nullptr));
      return;
    case DType::kBF16:
      fn(static_cast<__nv_bfloat16*>(nullptr));
      return;
    default:
      throw Error(StrCat("no CUDA kernel for dtype ", DTypeName(t)));
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

using cuda::FromFloat;
using cuda::ToFloat;

// ------------------------------------------------------------ elementwise map

// Functors with a scalar form (element i) and a vector form (elements
// 4i .. 4i+3 through float4 loads, used when every pointer is 16-byte aligned).
struct AxpyOp {
  const float* x;
  float* y;
  float alpha;
  __device__ void Scalar(int64_t i) const { y[i] += alpha * x[i]; }
  __device__ void Vector(int64_t i) const {
    const float4 a = reinterpret_cast<const float4*>(x)[i];
    float4 b = reinterpret_cast<float4*>(y)[i];
    b.x += alpha * a.x;
    b.y += alpha * a.y;
    b.z += alpha * a.z;
    b.w += alpha * a.w;
    reinterpret_cast<float4*>(y)[i] = b;
  }
};

struct ScaleOp {
  float* y;
  float alpha;
  __device__ void Scalar(int64_t i) const { y[i] *= alpha; }
  __device__ void Vector(int64_t i) const {
    float4 b = reinterpret_cast<float4*>(y)[i];
    b.x *= alpha;
    b.y *= alpha;
    b.z *= alpha;
    b.w *= alpha;
    reinterpret_cast<float4*>(y)[i] = b;
  }
};

__device__ __forceinline__ float Relu(float v) {
  return v > 0.f ? v : 0.f;
}  // NaN -> 0, as the CPU
__device__ __forceinline__ float ReluGrad(float y, float g) { return y > 0.f ? g : 0.f; }

struct ReluForwardOp {
  const float* x;
  float* y;
  __device__ void Scalar(int64_t i) const { y[i] = Relu(x[i]); }
  __device__ void Vector(int64_t i) const {
    const float4 a = reinterpret_cast<const float4*>(x)[i];
    reinterpret_cast<float4*>(y)[i] = make_float4(Relu(a.x), Relu(a.y), Relu(a.z), Relu(a.w));
  }
};

struct ReluBackwardOp {
  const float* y;
  const float* dy;
  float* dx;
  __device__ void Scalar(int64_t i) const { dx[i] = ReluGrad(y[i], dy[i]); }
  __device__ void Vector(int64_t i) const {
    const float4 a = reinterpret_cast<const float4*>(y)[i];
    const float4 g = reinterpret_cast<const float4*>(dy)[i];
    reinterpret_cast<float4*>(dx)[i] =
        make_float4(ReluGrad(a.x, g.x), ReluGrad(a.y, g.y), ReluGrad(a.z, g.z), ReluGrad(a.w, g.w));
  }
};

struct AddOp {
  const float* a;
  const float* b;
  float* y;
  __device__ void Scalar(int64_t i) const { y[i] = a[i] + b[i]; }
  __device__ void Vector(int64_t i) const {
    const float4 u = reinterpret_cast<const float4*>(a)[i];
    const float4 v = reinterpret_cast<const float4*>(b)[i];
    reinterpret_cast<float4*>(y)[i] = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
  }
};

// dx = dy * mask (the dropout's backward).
struct MulOp {
  const float* a;
  const float* b;
  float* y;
  __device__ void Scalar(int64_t i) const { y[i] = a[i] * b[i]; }
  __device__ void Vector(int64_t i) const {
    const float4 u = reinterpret_cast<const float4*>(a)[i];
    const float4 v = reinterpret_cast<const float4*>(b)[i];
    reinterpret_cast<float4*>(y)[i] = make_float4(u.x * v.x, u.y * v.y, u.z * v.z, u.w * v.w);
  }
};

// Half-precision (and generic) functors: computed in f32, rounded once. The
// vector form takes elements 4i .. 4i+3 one by one (no alignment needed).
#define CNNFLOW_VECTOR_BY_SCALARS                          \
  __device__ void Vector(int64_t i) const {                \
    for (int64_t k = 4 * i; k < 4 * i + 4; ++k) Scalar(k); \
  }

template <typename T>
struct AxpyT {
  const T* x;
  T* y;
  float alpha;
  __device__ void Scalar(int64_t i) const {
    y[i] = FromFloat<T>(ToFloat(y[i]) + alpha * ToFloat(x[i]));
  }
  CNNFLOW_VECTOR_BY_SCALARS
};

template <typename S, typename D>
struct CastT {
  const S* src;
  D* dst;
  __device__ void Scalar(int64_t i) const { dst[i] = FromFloat<D>(ToFloat(src[i])); }
  CNNFLOW_VECTOR_BY_SCALARS
};

template <typename S>
struct AddCastT {
  const S* src;
  float* dst;
  __device__ void Scalar(int64_t i) const { dst[i] += ToFloat(src[i]); }
  CNNFLOW_VECTOR_BY_SCALARS
};

// Relu keeps x itself (exact in any type); NaN -> 0 as the CPU.
template <typename T>
struct ReluForwardT {
  const T* x;
  T* y;
  __device__ void Scalar(int64_t i) const { y[i] = ToFloat(x[i]) > 0.f ? x[i] : FromFloat<T>(0.f); }
  CNNFLOW_VECTOR_BY_SCALARS
};

template <typename T>
struct ReluBackwardT {
  const T* y;
  const T* dy;
  T* dx;
  __device__ void Scalar(int64_t i) const {
    dx[i] = ToFloat(y[i]) > 0.f ? dy[i] : FromFloat<T>(0.f);
  }
  CNNFLOW_VECTOR_BY_SCALARS
};

template <typename T>
struct AddT {
  const T* a;
  const T* b;
  T* y;
  __device__ void Scalar(int64_t i) const { y[i] = FromFloat<T>(ToFloat(a[i]) + ToFloat(b[i])); }
  CNNFLOW_VECTOR_BY_SCALARS
};

// The half dropout's backward: the mask holds 0 or the rounded scale, so
// it only says kept or not; the multiplier is the f32 scale.
template <typename T>
struct DropoutBackwardT {
  const T* dy;
  const T* m;
  T* dx;
  float scale;
  __device__ void Scalar(int64_t i) const {
    dx[i] = FromFloat<T>(ToFloat(dy[i]) * (ToFloat(m[i]) != 0.f ? scale : 0.f));
  }
  CNNFLOW_VECTOR_BY_SCALARS
};

#undef CNNFLOW_VECTOR_BY_SCALARS

// Grid-stride over n elements: float4 groups first when `vec`, then the tail.
template <typename Op>
__global__ void MapKernel(Op op, int64_t n, bool vec) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t begin = 0;
  if (vec) {
    const int64_t n4 = n / 4;
    for (int64_t i = tid; i < n4; i += stride) op.Vector(i);
    begin = n4 * 4;
  }
  for (int64_t i = begin + tid; i < n; i += stride) op.Scalar(i);
}

template <typename Op>
void LaunchMap(const Op& op, int64_t n, bool aligned, cudaStream_t stream) {
  if (n == 0) return;
  const bool vec = aligned && n >= 4;
  MapKernel<Op><<<CudaBlocks(vec ? n / 4 : n), kCudaThreads, 0, stream>>>(op, n, vec);
  CNNFLOW_CUDA_CHECK_LAUNCH();
}

void CopyAsync(const Tensor& src, Tensor& dst, cudaStream_t stream) {
  if (dst.raw_data() == src.raw_data() || src.nbytes() == 0) return;
  CNNFLOW_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(),
                                     cudaMemcpyDeviceToDevice, stream));
}

// ------------------------------------------------------------ dropout

// ops/random.h's Mix64 (SplitMix64's finaliser), bit for bit on the device.
__device__ __forceinline__ uint64_t DeviceMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Element with draw counter c: kept (times scale) iff its 53 random bits are
// >= threshold = ceil(p * 2^53), exactly ops/cpu/dropout.cc's test.
__device__ __forceinline__ float DropoutMultiplier(uint64_t key, uint64_t c, uint64_t threshold,
                                                   float scale) {
  const uint64_t bits = DeviceMix64(key ^ DeviceMix64(c)) >> 11;
  return bits >= threshold ? scale : 0.f;
}

// Without sample ids the counter of element i is i.
// (T = float: m = mi, y = x * mi exactly as the CPU; a half type rounds
// both once.)
template <typename T>
__global__ void DropoutFlatKernel(const T* x, T* m, T* y, int64_t n, uint64_t key,
                                  uint64_t threshold, float scale) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float mi = DropoutMultiplier(key, static_cast<uint64_t>(i), threshold, scale);
    m[i] = FromFloat<T>(mi);
    y[i] = FromFloat<T>(ToFloat(x[i]) * mi);
  }
}

// With sample ids, row r's counters start at first[r] = sample_id * per_row.
// The ids travel in the kernel's parameters (no host buffer to keep alive,
// no copy): up to kIdRows rows per launch.
constexpr int kIdRows = 256;
struct RowStarts {
  int64_t first[kIdRows];
};

template <typename T>
__global__ void DropoutRowsKernel(const T* x, T* m, T* y, int64_t per, RowStarts starts,
                                  uint64_t key, uint64_t threshold, float scale) {
  const int64_t o = static_cast<int64_t>(blockIdx.y) * per;
  const int64_t first = starts.first[blockIdx.y];
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < per;
       j += stride) {
    // The CPU computes the counter as int64 first + j, then casts.
    const float mi = DropoutMultiplier(key, static_cast<uint64_t>(first + j), threshold, scale);
    m[o + j] = FromFloat<T>(mi);
    y[o + j] = FromFloat<T>(ToFloat(x[o + j]) * mi);
  }
}

// ------------------------------------------------------------ linear's bias

template <typename T>
__global__ void BroadcastRowsKernel(const float* bias, T* y, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = FromFloat<T>(bias[i % cols]);
  }
}

// One thread per column; the rows in order (coalesced across the threads),
// accumulated in f32 whatever T.
template <typename T>
__global__ void AddColumnSumsKernel(const T* g, float* sum, int64_t rows, int64_t cols) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < cols;
       o += stride) {
    float acc = sum[o];
    for (int64_t r = 0; r < rows; ++r) acc += ToFloat(g[r * cols + o]);
    sum[o] = acc;
  }
}

// ------------------------------------------------------------ layers

class CudaReluLayer : public ReluLayer {
 public:
  using ReluLayer::ReluLayer;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    const Tensor& in = *x[0];
    CheckGpuFloat(in, StrCat("relu '", name(), "' input"));
    CheckGpuFloat(y, StrCat("relu '", name(), "' output"));
    CheckSameGpu(in, y, StrCat("relu '", name(), "'"));
    CheckSameType(in, y, StrCat("relu '", name(), "'"));
    CNNFLOW_ENFORCE(in.numel() == y.numel(), "relu ", name(), ": ", in.shape(), " -> ", y.shape());
    CudaContext& c = CudaContext::For(in.device());
    if (in.dtype() == DType::kF32) {
      const float* xs = in.data<float>();
      float* ys = y.data<float>();
      LaunchMap(ReluForwardOp{xs, ys}, in.numel(), Aligned16(xs) && Aligned16(ys), c.stream());
      return;
    }
    DispatchGpuFloat(in.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      LaunchMap(
          ReluForwardT<T>{static_cast<const T*>(in.raw_data()), static_cast<T*>(y.raw_data())},
          in.numel(), true, c.stream());
    });
  }

  void Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    if (dx[0] == nullptr) return;
    CheckGpuFloat(dy, StrCat("relu '", name(), "' dy"));
    CheckGpuFloat(*dx[0], StrCat("relu '", name(), "' dx"));
    CheckSameType(y, dy, StrCat("relu '", name(), "' y and dy"));
    CheckSameType(dy, *dx[0], StrCat("relu '", name(), "' dy and dx"));
    CNNFLOW_ENFORCE(dy.numel() == y.numel() && dx[0]->numel() == y.numel(), "relu ", name(),
                    ": dy ", dy.shape(), " y ", y.shape());
    CudaContext& c = CudaContext::For(y.device());
    if (y.dtype() == DType::kF32) {
      const float* ys = y.data<float>();
      const float* g = dy.data<float>();
      float* d = dx[0]->data<float>();
      LaunchMap(ReluBackwardOp{ys, g, d}, y.numel(), Aligned16(ys) && Aligned16(g) && Aligned16(d),
                c.stream());
      return;
    }
    DispatchGpuFloat(y.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      LaunchMap(ReluBackwardT<T>{static_cast<const T*>(y.raw_data()),
                                 static_cast<const T*>(dy.raw_data()),
                                 static_cast<T*>(dx[0]->raw_data())},
                y.numel(), true, c.stream());
    });
  }
};

class CudaAddLayer : public AddLayer {
 public:
  using AddLayer::AddLayer;
  // Our add kernel has no ReLU epilogue: the relu stays a layer.
  bool FuseRelu() override { return false; }

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    const Tensor& a = *x[0];
    const Tensor& b = *x[1];
    CNNFLOW_ENFORCE(a.shape() == b.shape() && a.numel() == y.numel(), "add ", name(), ": ",
                    a.shape(), " + ", b.shape(), " -> ", y.shape());
    CheckGpuFloat(a, StrCat("add '", name(), "' input 0"));
    CheckGpuFloat(b, StrCat("add '", name(), "' input 1"));
    CheckGpuFloat(y, StrCat("add '", name(), "' output"));
    CheckSameGpu(a, b, StrCat("add '", name(), "'"));
    CheckSameGpu(a, y, StrCat("add '", name(), "'"));
    CheckSameType(a, b, StrCat("add '", name(), "' inputs"));
    CheckSameType(a, y, StrCat("add '", name(), "' input and output"));
    CudaContext& c = CudaContext::For(a.device());
    if (a.dtype() == DType::kF32) {
      const float* as = a.data<float>();
      const float* bs = b.data<float>();
      float* ys = y.data<float>();
      LaunchMap(AddOp{as, bs, ys}, a.numel(), Aligned16(as) && Aligned16(bs) && Aligned16(ys),
                c.stream());
      return;
    }
    DispatchGpuFloat(a.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      LaunchMap(AddT<T>{static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()),
                        static_cast<T*>(y.raw_data())},
                a.numel(), true, c.stream());
    });
  }

  void Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    CheckGpuFloat(dy, StrCat("add '", name(), "' dy"));
    CudaContext& c = CudaContext::For(dy.device());
    for (Tensor* d : dx) {
      if (d == nullptr) continue;
      CheckGpuFloat(*d, StrCat("add '", name(), "' dx"));
      CheckSameType(dy, *d, StrCat("add '", name(), "' dy and dx"));
      CNNFLOW_ENFORCE(d->numel() == dy.numel(), "add ", name(), ": dy ", dy.shape(), " dx ",
                      d->shape());
      CopyAsync(dy, *d, c.stream());
    }
  }
};

class CudaFlattenLayer : public FlattenLayer {
 public:
  using FlattenLayer::FlattenLayer;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    const Tensor& in = *x[0];
    CheckGpuFloat(in, StrCat("flatten '", name(), "' input"));
    CheckGpuFloat(y, StrCat("flatten '", name(), "' output"));
    CheckSameType(in, y, StrCat("flatten '", name(), "'"));
    CNNFLOW_ENFORCE(in.numel() == y.numel(), "flatten ", name(), ": ", in.shape(), " -> ",
                    y.shape());
    // Same bytes, another shape: a device-to-device copy, ordered on the stream.
    CopyAsync(in, y, CudaContext::For(in.device()).stream());
  }

  void Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    if (dx[0] == nullptr) return;
    CheckGpuFloat(dy, StrCat("flatten '", name(), "' dy"));
    CheckGpuFloat(*dx[0], StrCat("flatten '", name(), "' dx"));
    CheckSameType(dy, *dx[0], StrCat("flatten '", name(), "' dy and dx"));
    CNNFLOW_ENFORCE(dx[0]->numel() == dy.numel(), "flatten ", name(), ": dy ", dy.shape(), " dx ",
                    dx[0]->shape());
    CopyAsync(dy, *dx[0], CudaContext::For(dy.device()).stream());
  }
};

// In f16/bf16 the mask is in the compute dtype too (0 or the rounded
// scale): the keep/drop decisions are the f32 ones; y and dx use the f32 scale.
class CudaDropoutLayer : public DropoutLayer {
 public:
  using DropoutLayer::DropoutLayer;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override {
    const Tensor& in = *x[0];
    CheckGpuFloat(in, StrCat("dropout '", name(), "' input"));
    CheckGpuFloat(y, StrCat("dropout '", name(), "' output"));
    CheckSameGpu(in, y, StrCat("dropout '", name(), "'"));
    CheckSameType(in, y, StrCat("dropout '", name(), "'"));
    CNNFLOW_ENFORCE(in.numel() == y.numel(), "dropout ", name(), ": ", in.shape(), " -> ",
                    y.shape());
    CudaContext& c = CudaContext::For(in.device());
    last_training_ = ctx.training && p() > 0.0;
    if (!last_training_) {
      CopyAsync(in, y, c.stream());
      return;
    }
    if (!mask_.defined() || mask_.shape() != in.shape() || mask_.dtype() != in.dtype() ||
        mask_.device() != in.device()) {
      mask_ = Tensor::Empty(in.shape(), in.dtype(), in.device());
    }
    const int64_t n = in.numel();
    if (n == 0) return;
    const uint64_t key = MaskKey(ctx, name());
    // As ops/cpu/dropout.cc: kept iff (bits >> 11) >= ceil(p * 2^53).
    const uint64_t threshold = static_cast<uint64_t>(std::ceil(p() * 0x1.0p53));
    const float scale = KeptScale();
    DispatchGpuFloat(in.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      const T* xs = static_cast<const T*>(in.raw_data());
      T* m = static_cast<T*>(mask_.raw_data());
      T* ys = static_cast<T*>(y.raw_data());
      if (ctx.sample_ids == nullptr) {
        DropoutFlatKernel<T>
            <<<CudaBlocks(n), kCudaThreads, 0, c.stream()>>>(xs, m, ys, n, key, threshold, scale);
        CNNFLOW_CUDA_CHECK_LAUNCH();
        return;
      }
      const int64_t rows = in.dim(0), per = n / std::max<int64_t>(rows, 1);
      for (int64_t r0 = 0; r0 < rows; r0 += kIdRows) {
        const int64_t count = std::min<int64_t>(kIdRows, rows - r0);
        RowStarts starts;
        for (int64_t r = 0; r < count; ++r) starts.first[r] = ctx.sample_ids[r0 + r] * per;
        // Enough blocks along a row to keep the GPU busy, few for short rows.
        const unsigned bx = static_cast<unsigned>(
            std::max<int64_t>(1, std::min<int64_t>(CudaBlocks(per), 4096 / count)));
        const dim3 grid(bx, static_cast<unsigned>(count));
        const int64_t o = r0 * per;
        DropoutRowsKernel<T><<<grid, kCudaThreads, 0, c.stream()>>>(xs + o, m + o, ys + o, per,
                                                                    starts, key, threshold, scale);
        CNNFLOW_CUDA_CHECK_LAUNCH();
      }
    });
  }

  void Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    if (dx[0] == nullptr) return;
    CheckGpuFloat(dy, StrCat("dropout '", name(), "' dy"));
    CheckGpuFloat(*dx[0], StrCat("dropout '", name(), "' dx"));
    CheckSameType(dy, *dx[0], StrCat("dropout '", name(), "' dy and dx"));
    CNNFLOW_ENFORCE(dx[0]->numel() == dy.numel(), "dropout ", name(), ": dy ", dy.shape(), " dx ",
                    dx[0]->shape());
    CudaContext& c = CudaContext::For(dy.device());
    if (!last_training_) {
      CopyAsync(dy, *dx[0], c.stream());
      return;
    }
    CNNFLOW_ENFORCE(
        dy.shape() == mask_.shape() && dy.device() == mask_.device() && dy.dtype() == mask_.dtype(),
        "dropout ", name(), ": dy ", dy.shape(), " ", DTypeName(dy.dtype()), " on ",
        dy.device().ToString(), " but the last forward was ", mask_.shape(), " ",
        DTypeName(mask_.dtype()), " on ", mask_.device().ToString());
    if (dy.dtype() == DType::kF32) {
      const float* g = dy.data<float>();
      const float* m = mask_.data<float>();
      float* d = dx[0]->data<float>();
      LaunchMap(MulOp{g, m, d}, dy.numel(), Aligned16(g) && Aligned16(m) && Aligned16(d),
                c.stream());
      return;
    }
    DispatchGpuFloat(dy.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      LaunchMap(DropoutBackwardT<T>{static_cast<const T*>(dy.raw_data()),
                                    static_cast<const T*>(mask_.raw_data()),
                                    static_cast<T*>(dx[0]->raw_data()), KeptScale()},
                dy.numel(), true, c.stream());
    });
  }

 private:
  // The multiplier of a kept element, as ops/cpu/dropout.cc's (in f32).
  float KeptScale() const { return p() < 1.0 ? static_cast<float>(1.0 / (1.0 - p())) : 0.f; }
};

}  // namespace

// ------------------------------------------------------------ entry points

namespace cuda {

void Axpy(float alpha, const Tensor& x, Tensor& y) {
  CheckGpuFloat(x, "Axpy's x");
  CheckGpuFloat(y, "Axpy's y");
  CheckSameGpu(x, y, "Axpy");
  CheckSameType(x, y, "Axpy");
  CNNFLOW_ENFORCE(x.shape() == y.shape(), "Axpy of ", x.shape(), " into ", y.shape());
  CudaContext& c = CudaContext::For(y.device());
  if (y.dtype() == DType::kF32) {
    const float* xs = x.data<float>();
    float* ys = y.data<float>();
    LaunchMap(AxpyOp{xs, ys, alpha}, y.numel(), Aligned16(xs) && Aligned16(ys), c.stream());
    return;
  }
  DispatchGpuFloat(y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    LaunchMap(AxpyT<T>{static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()), alpha},
              y.numel(), true, c.stream());
  });
}

void ScaleFloats(float* data, int64_t n, float alpha, cudaStream_t stream) {
  LaunchMap(ScaleOp{data, alpha}, n, Aligned16(data), stream);
}

void Scale(Tensor& y, float alpha) {
  CheckGpuF32(y, "Scale's y");
  CudaContext& c = CudaContext::For(y.device());
  ScaleFloats(y.data<float>(), y.numel(), alpha, c.stream());
}

void Cast(const Tensor& src, Tensor& dst) {
  CheckGpuFloat(src, "Cast's source");
  CheckGpuFloat(dst, "Cast's destination");
  CheckSameGpu(src, dst, "Cast");
  CNNFLOW_ENFORCE(src.numel() == dst.numel(), "Cast of ", src.shape(), " ", DTypeName(src.dtype()),
                  " into ", dst.shape(), " ", DTypeName(dst.dtype()));
  CudaContext& c = CudaContext::For(dst.device());
  if (src.dtype() == dst.dtype()) {
    CopyAsync(src, dst, c.stream());
    return;
  }
  DispatchGpuFloat(src.dtype(), [&](auto* stag) {
    using S = std::remove_pointer_t<decltype(stag)>;
    DispatchGpuFloat(dst.dtype(), [&](auto* dtag) {
      using D = std::remove_pointer_t<decltype(dtag)>;
      LaunchMap(CastT<S, D>{static_cast<const S*>(src.raw_data()), static_cast<D*>(dst.raw_data())},
                src.numel(), true, c.stream());
    });
  });
}

void AddCast(const Tensor& src, Tensor& dst) {
  CheckGpuFloat(src, "AddCast's source");
  CheckGpuF32(dst, "AddCast's destination");
  CheckSameGpu(src, dst, "AddCast");
  CNNFLOW_ENFORCE(src.numel() == dst.numel(), "AddCast of ", src.shape(), " ",
                  DTypeName(src.dtype()), " into ", dst.shape());
  CudaContext& c = CudaContext::For(dst.device());
  if (src.dtype() == DType::kF32) {
    // dst += 1 * src, the f32 Axpy (its float4 path).
    const float* xs = src.data<float>();
    float* ys = dst.data<float>();
    LaunchMap(AxpyOp{xs, ys, 1.f}, dst.numel(), Aligned16(xs) && Aligned16(ys), c.stream());
    return;
  }
  DispatchGpuFloat(src.dtype(), [&](auto* tag) {
    using S = std::remove_pointer_t<decltype(tag)>;
    LaunchMap(AddCastT<S>{static_cast<const S*>(src.raw_data()), dst.data<float>()}, dst.numel(),
              true, c.stream());
  });
}

void BroadcastRows(const float* bias, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  BroadcastRows(bias, y, DType::kF32, rows, cols, stream);
}

void BroadcastRows(const float* bias, void* y, DType y_type, int64_t rows, int64_t cols,
                   cudaStream_t stream) {
  if (rows * cols == 0) return;
  DispatchGpuFloat(y_type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    BroadcastRowsKernel<T><<<CudaBlocks(rows * cols), kCudaThreads, 0, stream>>>(
        bias, static_cast<T*>(y), rows, cols);
    CNNFLOW_CUDA_CHECK_LAUNCH();
  });
}

void AddColumnSums(const float* g, float* sum, int64_t rows, int64_t cols, cudaStream_t stream) {
  AddColumnSums(g, DType::kF32, sum, rows, cols, stream);
}

void AddColumnSums(const void* g, DType g_type, float* sum, int64_t rows, int64_t cols,
                   cudaStream_t stream) {
  if (cols == 0) return;
  DispatchGpuFloat(g_type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    AddColumnSumsKernel<T>
        <<<CudaBlocks(cols), kCudaThreads, 0, stream>>>(static_cast<const T*>(g), sum, rows, cols);
    CNNFLOW_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace cuda

CNNFLOW_REGISTER_CUDA_LAYER(relu, CudaReluLayer);
CNNFLOW_REGISTER_CUDA_LAYER(add, CudaAddLayer);
CNNFLOW_REGISTER_CUDA_LAYER(flatten, CudaFlattenLayer);
CNNFLOW_REGISTER_CUDA_LAYER(dropout, CudaDropoutLayer);

}  // namespace cnnflow
