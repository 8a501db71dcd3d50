#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/map.cuh"
#include "ops/cuda/reduce.cuh"
#include "ops/cuda/sync_batch_norm.h"

namespace cnnflow::cuda {
namespace {

// The packing of ops/cpu/batch_norm_sums.h: a double as float hi + lo, a
// count as a * 4096 + b.
constexpr double kCountBase = 4096;
__device__ inline void PutSplit(double v, float* hi, float* lo) {
  *hi = static_cast<float>(v);
  *lo = static_cast<float>(v - static_cast<double>(*hi));
}
__device__ inline double GetSplit(float hi, float lo) {
  return static_cast<double>(hi) + static_cast<double>(lo);
}
__device__ inline double GetCount(const float* in) {
  return static_cast<double>(in[0]) * kCountBase + static_cast<double>(in[1]);
}

// Where element (sample i, channel c, position p) is.
struct Layout {
  int64_t n, c, s;
  bool nhwc;
  __device__ int64_t At(int64_t e, int64_t ch) const {  // e = i * s + p
    return nhwc ? e * c + ch : ((e / s) * c + ch) * s + e % s;
  }
};

// Pass 1, one block per channel: buf[ch], buf[c + ch] = sum(x) as hi/lo;
// block 0 also writes this replica's count.
template <typename T>
__global__ void SumKernel(Layout l, const T* x, float* buf) {
  const int64_t ch = blockIdx.x, m = l.n * l.s;
  double v = 0;
  for (int64_t e = threadIdx.x; e < m; e += blockDim.x) v += ToFloat(x[l.At(e, ch)]);
  v = BlockSum(v);
  if (threadIdx.x == 0) {
    PutSplit(v, &buf[ch], &buf[l.c + ch]);
    if (ch == 0) {
      buf[2 * l.c] = static_cast<float>(m / static_cast<int64_t>(kCountBase));
      buf[2 * l.c + 1] = static_cast<float>(m % static_cast<int64_t>(kCountBase));
    }
  }
}

// Pass 2: shift = the global mean of pass 1; buf[0..4c) = sum(x - shift),
// sum((x - shift)^2) as hi/lo pairs, the global count read from buf[4c..)
// (MoveCountKernel: pass 2's sums overwrite its pass-1 place).
template <typename T>
__global__ void CentredSumKernel(Layout l, const T* x, float* buf, double* shift, double* count) {
  const int64_t ch = blockIdx.x, m = l.n * l.s;
  __shared__ double sh;
  if (threadIdx.x == 0) {
    const double total = GetCount(&buf[4 * l.c]);
    sh = GetSplit(buf[ch], buf[l.c + ch]) / total;
    shift[ch] = sh;
    if (ch == 0) *count = total;
  }
  __syncthreads();
  const double k = sh;
  double s1 = 0, s2 = 0;
  for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
    const double d = static_cast<double>(ToFloat(x[l.At(e, ch)])) - k;
    s1 += d;
    s2 += d * d;
  }
  s1 = BlockSum(s1);
  s2 = BlockSum(s2);
  if (threadIdx.x == 0) {
    PutSplit(s1, &buf[ch], &buf[l.c + ch]);
    PutSplit(s2, &buf[2 * l.c + ch], &buf[3 * l.c + ch]);
  }
}

// Moves the count from buf[2c..] (pass 1's place) to buf[4c..]: pass 2's
// sums overwrite it. One thread, before CentredSumKernel.
__global__ void MoveCountKernel(float* buf, int64_t c) {
  buf[4 * c] = buf[2 * c];
  buf[4 * c + 1] = buf[2 * c + 1];
}

// Per channel, from the synced pass-2 sums: mean, 1/std; the running
// statistics take the unbiased variance.
__global__ void StatsKernel(int64_t c, const float* buf, const double* shift, const double* count,
                            float* mean, float* inv_std, float* running_mean, float* running_var,
                            double momentum, double eps) {
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  const double n = *count;
  const double s1 = GetSplit(buf[ch], buf[c + ch]) / n;
  const double var = fmax(GetSplit(buf[2 * c + ch], buf[3 * c + ch]) / n - s1 * s1, 0.0);
  const double mu = shift[ch] + s1;
  mean[ch] = static_cast<float>(mu);
  inv_std[ch] = static_cast<float>(1.0 / sqrt(var + eps));
  const double unbiased = n > 1 ? var * n / (n - 1) : var;
  running_mean[ch] = static_cast<float>((1 - momentum) * running_mean[ch] + momentum * mu);
  running_var[ch] = static_cast<float>((1 - momentum) * running_var[ch] + momentum * unbiased);
}

template <typename T>
struct NormaliseOp {
  Layout l;
  const T* x;
  T* y;
  const float *mean, *inv_std, *gamma, *beta;
  __device__ void Scalar(int64_t i) const {
    const int64_t ch = l.nhwc ? i % l.c : (i / l.s) % l.c;
    const float a = inv_std[ch] * (gamma ? gamma[ch] : 1.f);
    y[i] = FromFloat<T>((ToFloat(x[i]) - mean[ch]) * a + (beta ? beta[ch] : 0.f));
  }
  CNNFLOW_VECTOR_BY_SCALARS
};

// Backward's sums, one block per channel: buf[0..4c) = sum(dy), sum(dy *
// xhat) as hi/lo pairs; dgamma/dbeta += them (this replica's).
template <typename T>
__global__ void GradSumKernel(Layout l, const T* x, const T* dy, const float* mean,
                              const float* inv_std, float* buf, float* dgamma, float* dbeta) {
  const int64_t ch = blockIdx.x, m = l.n * l.s;
  const float mu = mean[ch], r = inv_std[ch];
  double sdy = 0, sdyx = 0;
  for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
    const int64_t at = l.At(e, ch);
    const double g = ToFloat(dy[at]);
    sdy += g;
    sdyx += g * static_cast<double>((ToFloat(x[at]) - mu) * r);
  }
  sdy = BlockSum(sdy);
  sdyx = BlockSum(sdyx);
  if (threadIdx.x == 0) {
    PutSplit(sdy, &buf[ch], &buf[l.c + ch]);
    PutSplit(sdyx, &buf[2 * l.c + ch], &buf[3 * l.c + ch]);
    if (dgamma) dgamma[ch] += static_cast<float>(sdyx);
    if (dbeta) dbeta[ch] += static_cast<float>(sdy);
  }
}

template <typename T>
struct InputGradOp {
  Layout l;
  const T *x, *dy;
  T* dx;
  const float *mean, *inv_std, *gamma, *buf;
  const double* count;
  __device__ void Scalar(int64_t i) const {
    const int64_t ch = l.nhwc ? i % l.c : (i / l.s) % l.c;
    const double n = *count;
    const float mdy = static_cast<float>(GetSplit(buf[ch], buf[l.c + ch]) / n);
    const float mdyx = static_cast<float>(GetSplit(buf[2 * l.c + ch], buf[3 * l.c + ch]) / n);
    const float r = inv_std[ch];
    const float xhat = (ToFloat(x[i]) - mean[ch]) * r;
    dx[i] = FromFloat<T>((gamma ? gamma[ch] : 1.f) * r * (ToFloat(dy[i]) - mdy - xhat * mdyx));
  }
  CNNFLOW_VECTOR_BY_SCALARS
};

Layout LayoutOf(const SyncBnShape& s) { return {s.n, s.c, s.s, s.nhwc}; }

void MakeState(const SyncBnShape& shape, Device device, SyncBnState& st) {
  if (st.buf.defined() && st.buf.device() == device && st.mean.numel() == shape.c) return;
  st.buf = Tensor::Zeros(Shape{4 * shape.c + 2}, DType::kF32, device);
  st.shift = Tensor::Zeros(Shape{shape.c}, DType::kF64, device);
  st.mean = Tensor::Zeros(Shape{shape.c}, DType::kF32, device);
  st.inv_std = Tensor::Zeros(Shape{shape.c}, DType::kF32, device);
  st.count = Tensor::Zeros(Shape{1}, DType::kF64, device);
}

unsigned Blocks(int64_t c) { return static_cast<unsigned>(c); }

}  // namespace

void SyncBatchNormForward(const SyncBnShape& shape, const Tensor& x, Tensor& y, const float* gamma,
                          const float* beta, float* running_mean, float* running_var,
                          double momentum, double eps, SyncBnState& st, const SyncSum& sync) {
  CheckGpuFloat(x, "SyncBN's x");
  CheckSameType(x, y, "SyncBN's x and y");
  CNNFLOW_ENFORCE(x.numel() == shape.n * shape.c * shape.s && shape.c <= 2147483647, "SyncBN: x ",
                  x.shape(), " is not [", shape.n, ", ", shape.c, ", ", shape.s, "]");
  MakeState(shape, x.device(), st);
  const cudaStream_t stream = CudaContext::For(x.device()).stream();
  const Layout l = LayoutOf(shape);
  float* buf = st.buf.data<float>();
  DispatchGpuFloat(x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = static_cast<const T*>(x.raw_data());
    SumKernel<T><<<Blocks(shape.c), kReduceThreads, 0, stream>>>(l, xs, buf);
    CNNFLOW_CUDA_CHECK(cudaGetLastError());
    sync(buf, 2 * shape.c + 2);
    MoveCountKernel<<<1, 1, 0, stream>>>(buf, shape.c);
    CentredSumKernel<T><<<Blocks(shape.c), kReduceThreads, 0, stream>>>(
        l, xs, buf, st.shift.data<double>(), st.count.data<double>());
    CNNFLOW_CUDA_CHECK(cudaGetLastError());
    sync(buf, 4 * shape.c);
    StatsKernel<<<CudaBlocks(shape.c), kCudaThreads, 0, stream>>>(
        shape.c, buf, st.shift.data<double>(), st.count.data<double>(), st.mean.data<float>(),
        st.inv_std.data<float>(), running_mean, running_var, momentum, eps);
    CNNFLOW_CUDA_CHECK(cudaGetLastError());
    LaunchMap(NormaliseOp<T>{l, xs, static_cast<T*>(y.raw_data()), st.mean.data<float>(),
                             st.inv_std.data<float>(), gamma, beta},
              x.numel(), false, stream);
  });
}

void SyncBatchNormBackward(const SyncBnShape& shape, const Tensor& x, const Tensor& dy, Tensor* dx,
                           const float* gamma, float* dgamma, float* dbeta, SyncBnState& st,
                           const SyncSum& sync) {
  CheckSameType(x, dy, "SyncBN's x and dy");
  CNNFLOW_ENFORCE(st.mean.defined() && st.mean.numel() == shape.c,
                  "SyncBN backward without a synced forward");
  const cudaStream_t stream = CudaContext::For(x.device()).stream();
  const Layout l = LayoutOf(shape);
  float* buf = st.buf.data<float>();
  DispatchGpuFloat(x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = static_cast<const T*>(x.raw_data());
    const T* gs = static_cast<const T*>(dy.raw_data());
    GradSumKernel<T><<<Blocks(shape.c), kReduceThreads, 0, stream>>>(
        l, xs, gs, st.mean.data<float>(), st.inv_std.data<float>(), buf, dgamma, dbeta);
    CNNFLOW_CUDA_CHECK(cudaGetLastError());
    if (dx == nullptr) return;  // as the CPU layer: no dx, no sync
    CheckSameType(x, *dx, "SyncBN's x and dx");
    sync(buf, 4 * shape.c);
    LaunchMap(InputGradOp<T>{l, xs, gs, static_cast<T*>(dx->raw_data()), st.mean.data<float>(),
                             st.inv_std.data<float>(), gamma, buf, st.count.data<double>()},
              x.numel(), false, stream);
  });
}

}  // namespace cnnflow::cuda
