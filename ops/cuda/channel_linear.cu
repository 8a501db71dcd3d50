// channel_linear on a GPU (ops/layers/channel_linear.h), f32, through
// cuBLAS on the compute stream. cuBLAS is column-major: a row-major [r, c]
// matrix is its column-major transpose with leading dimension c, so per
// sample n (X_n [C, P], Y_n [K, P], W [K, C]):
//   Y_n = W X_n          is  Y_n^T[P, K] = X_n^T[P, C] W^T[C, K]:   one strided-batched sgemm(N, N)
//   dX_n = W^T dY_n      is  dX_n^T[P, C] = dY_n^T[P, K] W[K, C]:   one strided-batched sgemm(N, T)
//   dW += dY_n X_n^T     is  dW^T[C, K] += X_n[C, P] dY_n^T[P, K]:  sgemm(T, N), sample by sample
// (dW's samples in order on one stream: the same sum on every run). The bias
// is written first (beta 1); db sums dy per channel, one block per channel.
#include <climits>
#include <vector>

#include "ops/cuda/cublas_api.h"
#include "ops/cuda/map.cuh"
#include "ops/cuda/reduce.cuh"
#include "ops/layers/channel_linear.h"

namespace cnnflow {
namespace {

using namespace cuda;

// y[n, k, p] = b[k].
__global__ void FillBias(const float* b, float* y, int64_t total, int64_t k, int64_t p) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    y[i] = b[(i / p) % k];
  }
}

// db[k] += sum over n, p of dy[n, k, p]; one block per k.
__global__ void AddBiasGrad(const float* dy, float* db, int64_t n, int64_t k, int64_t p) {
  float v = 0.f;
  for (int64_t t = threadIdx.x; t < n * p; t += blockDim.x) {
    v += dy[((t / p) * k + blockIdx.x) * p + t % p];
  }
  v = BlockSum(v);
  if (threadIdx.x == 0) db[blockIdx.x] += v;
}

int CheckedInt(int64_t v, const std::string& layer, const char* what) {
  if (v > INT_MAX) {
    throw Error(
        StrCat("channel_linear '", layer, "': ", what, " = ", v, " is too large for cuBLAS"));
  }
  return static_cast<int>(v);
}

class CudaChannelLinearLayer : public ChannelLinearLayer {
 public:
  using ChannelLinearLayer::ChannelLinearLayer;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    const Tensor& in = *x[0];
    CheckGpuF32(in, StrCat("channel_linear '", name(), "' input"));
    CheckGpuF32(y, StrCat("channel_linear '", name(), "' output"));
    const int64_t n = in.dim(0), c = in_channels(), k = out_channels(), p = positions();
    CNNFLOW_ENFORCE(in.numel() == n * c * p && y.numel() == n * k * p, "channel_linear ", name(),
                    ": input ", in.shape(), " output ", y.shape());
    if (n == 0) return;
    CudaContext& ctx = CudaContext::For(in.device());
    float beta = 0.f;
    if (has_bias()) {
      FillBias<<<CudaBlocks(y.numel()), kCudaThreads, 0, ctx.stream()>>>(
          parameters()[1].value.data<float>(), y.data<float>(), y.numel(), k, p);
      CNNFLOW_CUDA_CHECK_LAUNCH();
      beta = 1.f;
    }
    const int pi = CheckedInt(p, name(), "positions"), ci = CheckedInt(c, name(), "in"),
              ki = CheckedInt(k, name(), "out"), ni = CheckedInt(n, name(), "N");
    const float one = 1.f;
    CNNFLOW_CUBLAS_CHECK(detail::Cublas().SgemmStridedBatched(
        ctx.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, pi, ki, ci, &one, in.data<float>(), pi, c * p,
        parameters()[0].value.data<float>(), ci, 0, &beta, y.data<float>(), pi, k * p, ni));
  }

  void Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    const Tensor& in = *x[0];
    CheckGpuF32(in, StrCat("channel_linear '", name(), "' input"));
    CheckGpuF32(dy, StrCat("channel_linear '", name(), "' dy"));
    const int64_t n = in.dim(0), c = in_channels(), k = out_channels(), p = positions();
    CNNFLOW_ENFORCE(dy.numel() == n * k * p, "channel_linear ", name(), ": dy ", dy.shape());
    if (n == 0) return;
    CudaContext& ctx = CudaContext::For(in.device());
    const int pi = CheckedInt(p, name(), "positions"), ci = CheckedInt(c, name(), "in"),
              ki = CheckedInt(k, name(), "out"), ni = CheckedInt(n, name(), "N");
    const float one = 1.f, zero = 0.f;
    const float* g = dy.data<float>();
    const float* xs = in.data<float>();
    Parameter& wp = parameters()[0];
    if (dx[0] != nullptr) {
      CheckGpuF32(*dx[0], StrCat("channel_linear '", name(), "' dx"));
      CNNFLOW_CUBLAS_CHECK(detail::Cublas().SgemmStridedBatched(
          ctx.cublas(), CUBLAS_OP_N, CUBLAS_OP_T, pi, ci, ki, &one, g, pi, k * p,
          wp.value.data<float>(), ci, 0, &zero, dx[0]->data<float>(), pi, c * p, ni));
    }
    for (int64_t i = 0; i < n; ++i) {
      CNNFLOW_CUBLAS_CHECK(detail::Cublas().Sgemm(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, ci, ki,
                                                  pi, &one, xs + i * c * p, pi, g + i * k * p, pi,
                                                  &one, wp.grad.data<float>(), ci));
    }
    if (has_bias()) {
      AddBiasGrad<<<static_cast<unsigned>(k), kReduceThreads, 0, ctx.stream()>>>(
          g, parameters()[1].grad.data<float>(), n, k, p);
      CNNFLOW_CUDA_CHECK_LAUNCH();
    }
  }
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(channel_linear, CudaChannelLinearLayer);

}  // namespace cnnflow
