#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "ops/cuda/batch_norm_kernels.h"
#include "ops/cuda/channel_grid.h"
#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/map.cuh"
#include "ops/cuda/reduce.cuh"

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

// Every kernel over x runs on the shape's grid (ops/cuda/channel_grid.h).
using Grid = ChannelGrid;
constexpr int kTile = Grid::kTile;
constexpr int kTileRows = Grid::kTileRows;
static_assert(Grid::kThreads == kReduceThreads, "an NCHW block sums with BlockSum");

Grid GridOf(const BnShape& sh) { return Grid::Of(sh.n, sh.c, sh.s, sh.nhwc); }
dim3 Blocks(const Grid& g) { return dim3(g.tiles, g.strips); }
dim3 Threads(const Grid& g) { return dim3(g.threads_x(), g.threads_y()); }

__device__ __forceinline__ int64_t ChannelHere(const Grid& g) {
  return g.Channel(blockIdx.x, threadIdx.x);
}
template <typename F>
__device__ __forceinline__ void ForEachHere(const Grid& g, int64_t ch, F&& f) {
  g.ForEach(ch, blockIdx.y, threadIdx.x, threadIdx.y, f);
}

// Per block: partials[blockIdx.y][0 / 1][ch] = the sums of op's two terms
// over the values of channel ch this block covers.
template <typename Op>
__global__ void PartialSumsKernel(Grid g, Op op, double* partials) {
  const int64_t ch = ChannelHere(g);
  const bool valid = ch < g.c;
  double a = 0, b = 0;
  if (valid) {
    const typename Op::Constants k = op.Of(ch);
    ForEachHere(g, ch, [&](int64_t at) { op.Add(k, at, a, b); });
  }
  double* out = partials + static_cast<int64_t>(blockIdx.y) * 2 * g.c;
  if (g.nhwc) {  // the block's kTileRows rows of each channel, in order
    __shared__ double sa[kTileRows][kTile], sb[kTileRows][kTile];
    sa[threadIdx.y][threadIdx.x] = a;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && valid) {
      for (int r = 1; r < kTileRows; ++r) {
        a += sa[r][threadIdx.x];
        b += sb[r][threadIdx.x];
      }
      out[ch] = a;
      out[g.c + ch] = b;
    }
    return;
  }
  a = BlockSum(a);
  b = BlockSum(b);
  if (threadIdx.x == 0) {
    out[ch] = a;
    out[g.c + ch] = b;
  }
}

// One thread per channel: the strips' sums in order, into buf as hi/lo
// pairs [a hi, a lo, b hi, b lo] (c each) and this replica's count after
// them; dgamma += b, dbeta += a when given (backward's own sums).
__global__ void FinishSumsKernel(int64_t c, unsigned strips, const double* partials, int64_t count,
                                 float* buf, float* dgamma, float* dbeta) {
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  double a = 0, b = 0;
  for (unsigned k = 0; k < strips; ++k) {
    a += partials[2 * k * c + ch];
    b += partials[(2 * k + 1) * c + ch];
  }
  PutSplit(a, &buf[ch], &buf[c + ch]);
  PutSplit(b, &buf[2 * c + ch], &buf[3 * c + ch]);
  if (ch == 0) {
    buf[4 * c] = static_cast<float>(count / static_cast<int64_t>(kCountBase));
    buf[4 * c + 1] = static_cast<float>(count % static_cast<int64_t>(kCountBase));
  }
  if (dgamma) dgamma[ch] += static_cast<float>(b);
  if (dbeta) dbeta[ch] += static_cast<float>(a);
}

// Forward's terms: d = x - shift (shift null: 0) and d^2.
template <typename T>
struct StatsTerms {
  const T* x;
  const double* shift;
  struct Constants {
    double shift;
  };
  __device__ Constants Of(int64_t ch) const { return {shift ? shift[ch] : 0.0}; }
  __device__ void Add(const Constants& k, int64_t at, double& a, double& b) const {
    const double d = static_cast<double>(ToFloat(x[at])) - k.shift;
    a += d;
    b += d * d;
  }
};

// SyncBN between its passes: shift = the global mean of pass 1's sums.
__global__ void ShiftKernel(int64_t c, const float* buf, double* shift) {
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch < c) shift[ch] = GetSplit(buf[ch], buf[c + ch]) / GetCount(&buf[4 * c]);
}

// Per channel, from the (synced) sums around shift: mean, 1/std, gamma/std;
// the running statistics take the unbiased variance.
__global__ void StatsKernel(int64_t c, const float* buf, const double* shift, const float* gamma,
                            float* mean, float* inv_std, float* scale, float* running_mean,
                            float* running_var, double momentum, double eps) {
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  const double n = GetCount(&buf[4 * c]);
  const double s1 = GetSplit(buf[ch], buf[c + ch]) / n;
  const double var = fmax(GetSplit(buf[2 * c + ch], buf[3 * c + ch]) / n - s1 * s1, 0.0);
  const double mu = (shift ? shift[ch] : 0.0) + s1;
  mean[ch] = static_cast<float>(mu);
  inv_std[ch] = static_cast<float>(1.0 / sqrt(var + eps));
  scale[ch] = inv_std[ch] * (gamma ? gamma[ch] : 1.f);
  const double unbiased = n > 1 ? var * n / (n - 1) : var;
  running_mean[ch] = static_cast<float>((1 - momentum) * running_mean[ch] + momentum * mu);
  running_var[ch] = static_cast<float>((1 - momentum) * running_var[ch] + momentum * unbiased);
}

// bn(x) before the ReLU: the forward's expression, which backward repeats
// for the ReLU's mask (an explicit fma: the same bits in both kernels).
__device__ __forceinline__ float Normalised(float x, float mean, float scale, float beta) {
  return __fmaf_rn(x - mean, scale, beta);
}
__device__ __forceinline__ float Relu(float v) { return v > 0.f ? v : 0.f; }  // NaN -> 0

// Whether the forward's y = T(max(bn(x), 0)) is > 0: where the ReLU passes
// the gradient on, as the relu layer's y > 0.
template <typename T>
__device__ __forceinline__ bool ReluPasses(float z) {
  return ToFloat(FromFloat<T>(z)) > 0.f;
}

struct ChannelConstants {
  float mean, inv_std, scale, beta;
};

// y = bn(x), + the residual r when given, then the ReLU when asked.
template <typename T>
__global__ void NormaliseKernel(Grid g, const T* x, const T* r, T* y, const float* mean,
                                const float* scale, const float* beta, bool relu) {
  const int64_t ch = ChannelHere(g);
  if (ch >= g.c) return;
  const float mu = mean[ch], a = scale[ch], b = beta ? beta[ch] : 0.f;
  ForEachHere(g, ch, [&](int64_t at) {
    float z = Normalised(ToFloat(x[at]), mu, a, b);
    if (r) z += ToFloat(r[at]);
    y[at] = FromFloat<T>(relu ? Relu(z) : z);
  });
}

// Backward's terms: g = dy (through the fused ReLU's mask) and g * xhat.
template <typename T>
struct GradTerms {
  const T* x;
  const T* dy;
  const float *mean, *inv_std, *scale, *beta;
  bool relu;
  using Constants = ChannelConstants;
  __device__ Constants Of(int64_t ch) const {
    return {mean[ch], inv_std[ch], scale[ch], beta ? beta[ch] : 0.f};
  }
  __device__ float Grad(const Constants& k, float xv, float g) const {
    return relu && !ReluPasses<T>(Normalised(xv, k.mean, k.scale, k.beta)) ? 0.f : g;
  }
  __device__ void Add(const Constants& k, int64_t at, double& a, double& b) const {
    const float xv = ToFloat(x[at]);
    const double g = Grad(k, xv, ToFloat(dy[at]));
    a += g;
    b += g * static_cast<double>((xv - k.mean) * k.inv_std);
  }
};

// Per channel, from the (synced) backward sums: mean(dy), mean(dy * xhat).
__global__ void GradMeansKernel(int64_t c, const float* buf, float* coef) {
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  const double n = GetCount(&buf[4 * c]);
  coef[ch] = static_cast<float>(GetSplit(buf[ch], buf[c + ch]) / n);
  coef[c + ch] = static_cast<float>(GetSplit(buf[2 * c + ch], buf[3 * c + ch]) / n);
}

// dx = gamma / std * (g - mean(g) - xhat * mean(g * xhat)).
template <typename T>
__global__ void InputGradKernel(Grid g, GradTerms<T> terms, const float* coef, T* dx) {
  const int64_t ch = ChannelHere(g);
  if (ch >= g.c) return;
  const ChannelConstants k = terms.Of(ch);
  const float mdy = coef[ch], mdyx = coef[g.c + ch];
  ForEachHere(g, ch, [&](int64_t at) {
    const float xv = ToFloat(terms.x[at]);
    const float gr = terms.Grad(k, xv, ToFloat(terms.dy[at]));
    const float xhat = (xv - k.mean) * k.inv_std;
    dx[at] = FromFloat<T>(k.scale * (gr - mdy - xhat * mdyx));
  });
}

void MakeState(const BnShape& shape, const Grid& grid, Device device, BnState& st) {
  const int64_t c = shape.c;
  if (!st.buf.defined() || st.buf.device() != device || st.mean.numel() != c) {
    st.buf = Tensor::Zeros(Shape{4 * c + 2}, DType::kF32, device);
    st.shift = Tensor::Zeros(Shape{c}, DType::kF64, device);
    st.mean = Tensor::Zeros(Shape{c}, DType::kF32, device);
    st.inv_std = Tensor::Zeros(Shape{c}, DType::kF32, device);
    st.scale = Tensor::Zeros(Shape{c}, DType::kF32, device);
    st.coef = Tensor::Zeros(Shape{2 * c}, DType::kF32, device);
  }
  const int64_t partials = static_cast<int64_t>(grid.strips) * 2 * c;
  if (!st.partials.defined() || st.partials.device() != device || st.partials.numel() < partials) {
    st.partials = Tensor::Empty(Shape{partials}, DType::kF64, device);
  }
}

template <typename Op>
void LaunchSums(const Grid& g, const Op& op, int64_t count, BnState& st, float* dgamma,
                float* dbeta, cudaStream_t stream) {
  double* partials = st.partials.data<double>();
  PartialSumsKernel<Op><<<Blocks(g), Threads(g), 0, stream>>>(g, op, partials);
  CNNFLOW_CUDA_CHECK_LAUNCH();
  FinishSumsKernel<<<CudaBlocks(g.c), kCudaThreads, 0, stream>>>(
      g.c, g.strips, partials, count, st.buf.data<float>(), dgamma, dbeta);
  CNNFLOW_CUDA_CHECK_LAUNCH();
}

void CheckShape(const BnShape& shape, const Tensor& x, const char* what) {
  CNNFLOW_ENFORCE(x.numel() == shape.n * shape.c * shape.s && shape.c <= 2147483647, what, ": x ",
                  x.shape(), " is not [", shape.n, ", ", shape.c, ", ", shape.s, "]");
}

}  // namespace

void BatchNormTrainForward(const BnShape& shape, const Tensor& x, Tensor* y, const BnAffine& affine,
                           float* running_mean, float* running_var, double momentum, double eps,
                           BnState& st, const SyncSum* sync) {
  CheckGpuFloat(x, "batchnorm's x");
  CheckShape(shape, x, "batchnorm forward");
  const Grid g = GridOf(shape);
  MakeState(shape, g, x.device(), st);
  const cudaStream_t stream = CudaContext::For(x.device()).stream();
  float* buf = st.buf.data<float>();
  const int64_t c = shape.c, count = shape.n * shape.s;
  DispatchGpuFloat(x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = static_cast<const T*>(x.raw_data());
    double* shift = nullptr;
    if (sync != nullptr) {  // pass 1: the global mean, to centre pass 2 on
      LaunchSums(g, StatsTerms<T>{xs, nullptr}, count, st, nullptr, nullptr, stream);
      (*sync)(buf, 4 * c + 2);
      shift = st.shift.data<double>();
      ShiftKernel<<<CudaBlocks(c), kCudaThreads, 0, stream>>>(c, buf, shift);
      CNNFLOW_CUDA_CHECK_LAUNCH();
    }
    LaunchSums(g, StatsTerms<T>{xs, shift}, count, st, nullptr, nullptr, stream);
    if (sync != nullptr) (*sync)(buf, 4 * c + 2);
    StatsKernel<<<CudaBlocks(c), kCudaThreads, 0, stream>>>(
        c, buf, shift, affine.gamma, st.mean.data<float>(), st.inv_std.data<float>(),
        st.scale.data<float>(), running_mean, running_var, momentum, eps);
    CNNFLOW_CUDA_CHECK_LAUNCH();
  });
  if (y != nullptr) BatchNormNormalise(shape, x, nullptr, *y, affine, st);
}

void BatchNormNormalise(const BnShape& shape, const Tensor& x, const Tensor* residual, Tensor& y,
                        const BnAffine& affine, const BnState& st) {
  CheckSameType(x, y, "batchnorm's x and y");
  CheckShape(shape, y, "batchnorm's output");
  if (residual != nullptr) {
    CheckSameType(x, *residual, "batchnorm's x and the residual");
    CheckShape(shape, *residual, "the residual added to batchnorm's output");
  }
  CNNFLOW_ENFORCE(st.mean.defined() && st.mean.numel() == shape.c,
                  "batchnorm's output without a forward of these kernels");
  const Grid g = GridOf(shape);
  const cudaStream_t stream = CudaContext::For(x.device()).stream();
  DispatchGpuFloat(x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    NormaliseKernel<T><<<Blocks(g), Threads(g), 0, stream>>>(
        g, static_cast<const T*>(x.raw_data()),
        residual ? static_cast<const T*>(residual->raw_data()) : nullptr,
        static_cast<T*>(y.raw_data()), st.mean.data<float>(), st.scale.data<float>(), affine.beta,
        affine.relu);
    CNNFLOW_CUDA_CHECK_LAUNCH();
  });
}

void BatchNormTrainBackward(const BnShape& shape, const Tensor& x, const Tensor& dy, Tensor* dx,
                            const BnAffine& affine, float* dgamma, float* dbeta, BnState& st,
                            const SyncSum* sync) {
  CheckSameType(x, dy, "batchnorm's x and dy");
  CheckShape(shape, x, "batchnorm backward");
  CNNFLOW_ENFORCE(st.mean.defined() && st.mean.numel() == shape.c,
                  "batchnorm backward without a forward of these kernels");
  const Grid g = GridOf(shape);
  MakeState(shape, g, x.device(), st);
  const cudaStream_t stream = CudaContext::For(x.device()).stream();
  float* buf = st.buf.data<float>();
  const int64_t c = shape.c;
  DispatchGpuFloat(x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const GradTerms<T> terms{static_cast<const T*>(x.raw_data()),
                             static_cast<const T*>(dy.raw_data()),
                             st.mean.data<float>(),
                             st.inv_std.data<float>(),
                             st.scale.data<float>(),
                             affine.beta,
                             affine.relu};
    LaunchSums(g, terms, shape.n * shape.s, st, dgamma, dbeta, stream);
    if (dx == nullptr) return;  // as the CPU layer: no dx, no sync
    CheckSameType(x, *dx, "batchnorm's x and dx");
    if (sync != nullptr) (*sync)(buf, 4 * c + 2);
    GradMeansKernel<<<CudaBlocks(c), kCudaThreads, 0, stream>>>(c, buf, st.coef.data<float>());
    CNNFLOW_CUDA_CHECK_LAUNCH();
    InputGradKernel<T><<<Blocks(g), Threads(g), 0, stream>>>(g, terms, st.coef.data<float>(),
                                                             static_cast<T*>(dx->raw_data()));
    CNNFLOW_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace cnnflow::cuda
