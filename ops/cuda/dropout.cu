// dropout on a GPU (ops/layers/dropout.h): draws ops/cpu/dropout.cc's mask bit for
// bit (the same counter-based hash on the device), in f32 or, under mixed
// precision, f16/bf16.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "ops/cuda/map.cuh"
#include "ops/layers/dropout.h"

namespace cnnflow {
namespace {

using namespace cuda;  // the shared map and checks (ops/cuda/map.cuh)

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

CNNFLOW_REGISTER_CUDA_LAYER(dropout, CudaDropoutLayer);

}  // namespace cnnflow
