// groupnorm on a GPU (ops/layers/group_norm.h), f32. One block per
// (sample, group), whose M = C/G x P values are contiguous: block sums for
// the mean and the (two-pass) variance, then y; backward's data gradient
// the same way; the weight and bias gradients take one block per channel
// over the batch and positions.
#include <cuda_runtime.h>

#include <vector>

#include "ops/cuda/map.cuh"
#include "ops/cuda/reduce.cuh"
#include "ops/layers/group_norm.h"

namespace cnnflow {
namespace {

using namespace cuda;

// Block t = sample * G + group; channel of element j of the group: c0 + j / p.
__global__ void GroupNormForward(const float* x, const float* w, const float* b, float* y,
                                 float* mean, float* rstd, int64_t groups, int64_t cg, int64_t p,
                                 float eps) {
  const int64_t t = blockIdx.x, m = cg * p, c0 = (t % groups) * cg;
  const float* xg = x + t * m;
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) s += xg[j];
  const float mu = BlockSum(s) / static_cast<float>(m);
  s = 0.f;
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) s += (xg[j] - mu) * (xg[j] - mu);
  const float rs = rsqrtf(BlockSum(s) / static_cast<float>(m) + eps);
  if (threadIdx.x == 0) {
    mean[t] = mu;
    rstd[t] = rs;
  }
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
    const float v = (xg[j] - mu) * rs;
    const int64_t c = c0 + j / p;
    y[t * m + j] = w != nullptr ? v * w[c] + b[c] : v;
  }
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)) over the group, g = dy w.
__global__ void GroupNormBackwardData(const float* x, const float* dy, const float* w,
                                      const float* mean, const float* rstd, float* dx,
                                      int64_t groups, int64_t cg, int64_t p) {
  const int64_t t = blockIdx.x, m = cg * p, c0 = (t % groups) * cg;
  const float mu = mean[t], rs = rstd[t];
  float s1 = 0.f, s2 = 0.f;
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
    const float g = dy[t * m + j] * (w != nullptr ? w[c0 + j / p] : 1.f);
    s1 += g;
    s2 += g * (x[t * m + j] - mu) * rs;
  }
  s1 = BlockSum(s1) / static_cast<float>(m);
  s2 = BlockSum(s2) / static_cast<float>(m);
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
    const float g = dy[t * m + j] * (w != nullptr ? w[c0 + j / p] : 1.f);
    dx[t * m + j] = rs * (g - s1 - (x[t * m + j] - mu) * rs * s2);
  }
}

// dw[c] += sum dy xhat, db[c] += sum dy over the batch and positions; one block per channel.
__global__ void GroupNormParamGrads(const float* x, const float* dy, const float* mean,
                                    const float* rstd, float* dw, float* db, int64_t n, int64_t c_n,
                                    int64_t groups, int64_t p) {
  const int64_t c = blockIdx.x, cg = c_n / groups;
  float sw = 0.f, sb = 0.f;
  for (int64_t t = threadIdx.x; t < n * p; t += blockDim.x) {
    const int64_t i = t / p, e = (i * c_n + c) * p + t % p, s = i * groups + c / cg;
    sw += dy[e] * (x[e] - mean[s]) * rstd[s];
    sb += dy[e];
  }
  sw = BlockSum(sw);
  sb = BlockSum(sb);
  if (threadIdx.x == 0) {
    dw[c] += sw;
    db[c] += sb;
  }
}

class CudaGroupNormLayer : public GroupNormLayer {
 public:
  using GroupNormLayer::GroupNormLayer;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    const Tensor& in = *x[0];
    CheckGpuF32(in, StrCat("groupnorm '", name(), "' input"));
    CheckGpuF32(y, StrCat("groupnorm '", name(), "' output"));
    const int64_t n = in.dim(0);
    CNNFLOW_ENFORCE(in.numel() == n * channels_ * positions_ && y.numel() == in.numel(),
                    "groupnorm ", name(), ": ", in.shape(), " -> ", y.shape());
    if (!mean_.defined() || mean_.numel() != n * groups_ || mean_.device() != in.device()) {
      mean_ = Tensor::Empty({n * groups_}, DType::kF32, in.device());
      rstd_ = Tensor::Empty({n * groups_}, DType::kF32, in.device());
    }
    if (n == 0) return;
    const float* w = affine_ ? parameters()[0].value.data<float>() : nullptr;
    const float* b = affine_ ? parameters()[1].value.data<float>() : nullptr;
    GroupNormForward<<<static_cast<unsigned>(n * groups_), kReduceThreads, 0,
                       CudaContext::For(in.device()).stream()>>>(
        in.data<float>(), w, b, y.data<float>(), mean_.data<float>(), rstd_.data<float>(), groups_,
        channels_ / groups_, positions_, static_cast<float>(eps_));
    CNNFLOW_CUDA_CHECK_LAUNCH();
  }

  void Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    const Tensor& in = *x[0];
    CheckGpuF32(dy, StrCat("groupnorm '", name(), "' dy"));
    const int64_t n = in.dim(0);
    CNNFLOW_ENFORCE(
        dy.numel() == n * channels_ * positions_ && mean_.defined() && mean_.numel() == n * groups_,
        "groupnorm ", name(), ": dy ", dy.shape(), " without a forward of its shape");
    if (n == 0) return;
    cudaStream_t stream = CudaContext::For(dy.device()).stream();
    const float* w = affine_ ? parameters()[0].value.data<float>() : nullptr;
    if (dx[0] != nullptr) {
      CheckGpuF32(*dx[0], StrCat("groupnorm '", name(), "' dx"));
      GroupNormBackwardData<<<static_cast<unsigned>(n * groups_), kReduceThreads, 0, stream>>>(
          in.data<float>(), dy.data<float>(), w, mean_.data<float>(), rstd_.data<float>(),
          dx[0]->data<float>(), groups_, channels_ / groups_, positions_);
      CNNFLOW_CUDA_CHECK_LAUNCH();
    }
    if (affine_) {
      GroupNormParamGrads<<<static_cast<unsigned>(channels_), kReduceThreads, 0, stream>>>(
          in.data<float>(), dy.data<float>(), mean_.data<float>(), rstd_.data<float>(),
          parameters()[0].grad.data<float>(), parameters()[1].grad.data<float>(), n, channels_,
          groups_, positions_);
      CNNFLOW_CUDA_CHECK_LAUNCH();
    }
  }
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(groupnorm, CudaGroupNormLayer);

}  // namespace cnnflow
