// Elementwise CUDA kernels that are not layers: Axpy, Scale, Cast and
// AddCast (ops/cuda/kernels.h), the sums of the lane collectives and the
// bias helpers of the linear layer
// (ops/cuda/elementwise.h). Half values are computed in f32 and rounded
// once. The elementwise layers have files of their own (relu.cu, add.cu,
// flatten.cu, dropout.cu), on the same map (ops/cuda/map.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ops/cuda/kernels.h"
#include "ops/cuda/map.cuh"

namespace cnnflow::cuda {
namespace {

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

}  // namespace

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

namespace {

struct LanePointers {
  float* p[kMaxLanes];
};

// The node of level l at lane a adds lane a + 2^l's partial into its own,
// as ops/collectives/reduction_tree.h's tree.
__global__ void LaneTreeSumKernel(LanePointers data, int lanes, int64_t count, float scale) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    float v[kMaxLanes];
    for (int l = 0; l < lanes; ++l) v[l] = data.p[l][i];
    for (int step = 1; step < lanes; step *= 2) {
      for (int a = 0; a + step < lanes; a += 2 * step) v[a] = v[a] + v[a + step];
    }
    const float s = v[0] * scale;
    for (int l = 0; l < lanes; ++l) data.p[l][i] = s;
  }
}

__global__ void LaneBroadcastKernel(LanePointers data, int lanes, int64_t count) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const float v = data.p[0][i];
    for (int l = 1; l < lanes; ++l) data.p[l][i] = v;
  }
}

LanePointers PointersOf(float* const* data, int lanes) {
  CNNFLOW_ENFORCE(lanes >= 1 && lanes <= kMaxLanes, lanes, " lanes: at most ", kMaxLanes);
  LanePointers p{};
  for (int l = 0; l < lanes; ++l) p.p[l] = data[l];
  return p;
}

}  // namespace

void LaneTreeSum(float* const* data, int lanes, int64_t count, float scale, cudaStream_t stream) {
  if (count == 0) return;
  LaneTreeSumKernel<<<CudaBlocks(count), kCudaThreads, 0, stream>>>(PointersOf(data, lanes), lanes,
                                                                    count, scale);
  CNNFLOW_CUDA_CHECK(cudaGetLastError());
}

void LaneBroadcast(float* const* data, int lanes, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  LaneBroadcastKernel<<<CudaBlocks(count), kCudaThreads, 0, stream>>>(PointersOf(data, lanes),
                                                                      lanes, count);
  CNNFLOW_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cnnflow::cuda
