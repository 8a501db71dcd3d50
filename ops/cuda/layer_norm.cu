// layernorm on a GPU (ops/layers/layer_norm.h), f32. One thread per
// (sample, position) walks the C channels (neighbouring threads read
// neighbouring positions: coalesced), two passes for the variance, as the
// CPU; backward's data gradient likewise; the weight and bias gradients
// take one block per channel over the batch and positions.
#include <cuda_runtime.h>

#include <vector>

#include "ops/cuda/map.cuh"
#include "ops/cuda/reduce.cuh"
#include "ops/layers/layer_norm.h"

namespace cnnflow {
namespace {

using namespace cuda;

// Element (sample i / P, channel ch, position i % P) of a [N, C, P] tensor.
__device__ __forceinline__ int64_t At(int64_t i, int64_t ch, int64_t c, int64_t p) {
  return ((i / p) * c + ch) * p + i % p;
}

__global__ void LayerNormForward(const float* x, const float* w, const float* b, float* y,
                                 float* mean, float* rstd, int64_t rows, int64_t c, int64_t p,
                                 float eps) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows;
       i += stride) {
    float mu = 0.f, var = 0.f;
    for (int64_t ch = 0; ch < c; ++ch) mu += x[At(i, ch, c, p)];
    mu /= static_cast<float>(c);
    for (int64_t ch = 0; ch < c; ++ch) {
      const float d = x[At(i, ch, c, p)] - mu;
      var += d * d;
    }
    const float rs = rsqrtf(var / static_cast<float>(c) + eps);
    mean[i] = mu;
    rstd[i] = rs;
    for (int64_t ch = 0; ch < c; ++ch) {
      const int64_t e = At(i, ch, c, p);
      const float v = (x[e] - mu) * rs;
      y[e] = w != nullptr ? v * w[ch] + b[ch] : v;
    }
  }
}

// dx = rstd (g - mean_c(g) - xhat mean_c(g xhat)), g = dy w.
__global__ void LayerNormBackwardData(const float* x, const float* dy, const float* w,
                                      const float* mean, const float* rstd, float* dx, int64_t rows,
                                      int64_t c, int64_t p) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows;
       i += stride) {
    const float mu = mean[i], rs = rstd[i];
    float s1 = 0.f, s2 = 0.f;
    for (int64_t ch = 0; ch < c; ++ch) {
      const int64_t e = At(i, ch, c, p);
      const float g = dy[e] * (w != nullptr ? w[ch] : 1.f);
      s1 += g;
      s2 += g * (x[e] - mu) * rs;
    }
    s1 /= static_cast<float>(c);
    s2 /= static_cast<float>(c);
    for (int64_t ch = 0; ch < c; ++ch) {
      const int64_t e = At(i, ch, c, p);
      const float g = dy[e] * (w != nullptr ? w[ch] : 1.f);
      dx[e] = rs * (g - s1 - (x[e] - mu) * rs * s2);
    }
  }
}

// dw[ch] += sum dy xhat, db[ch] += sum dy over the batch and positions; one block per channel.
__global__ void LayerNormParamGrads(const float* x, const float* dy, const float* mean,
                                    const float* rstd, float* dw, float* db, int64_t rows,
                                    int64_t c, int64_t p) {
  const int64_t ch = blockIdx.x;
  float sw = 0.f, sb = 0.f;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    const int64_t e = At(i, ch, c, p);
    sw += dy[e] * (x[e] - mean[i]) * rstd[i];
    sb += dy[e];
  }
  sw = BlockSum(sw);
  sb = BlockSum(sb);
  if (threadIdx.x == 0) {
    dw[ch] += sw;
    db[ch] += sb;
  }
}

class CudaLayerNormLayer : public LayerNormLayer {
 public:
  using LayerNormLayer::LayerNormLayer;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    const Tensor& in = *x[0];
    CheckGpuF32(in, StrCat("layernorm '", name(), "' input"));
    CheckGpuF32(y, StrCat("layernorm '", name(), "' output"));
    const int64_t rows = in.dim(0) * positions_;
    CNNFLOW_ENFORCE(in.numel() == rows * channels_ && y.numel() == in.numel(), "layernorm ", name(),
                    ": ", in.shape(), " -> ", y.shape());
    if (!mean_.defined() || mean_.numel() != rows || mean_.device() != in.device()) {
      mean_ = Tensor::Empty({rows}, DType::kF32, in.device());
      rstd_ = Tensor::Empty({rows}, DType::kF32, in.device());
    }
    if (rows == 0) return;
    const float* w = affine_ ? parameters()[0].value.data<float>() : nullptr;
    const float* b = affine_ ? parameters()[1].value.data<float>() : nullptr;
    LayerNormForward<<<CudaBlocks(rows), kCudaThreads, 0, CudaContext::For(in.device()).stream()>>>(
        in.data<float>(), w, b, y.data<float>(), mean_.data<float>(), rstd_.data<float>(), rows,
        channels_, positions_, static_cast<float>(eps_));
    CNNFLOW_CUDA_CHECK_LAUNCH();
  }

  void Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    const Tensor& in = *x[0];
    CheckGpuF32(dy, StrCat("layernorm '", name(), "' dy"));
    const int64_t rows = in.dim(0) * positions_;
    CNNFLOW_ENFORCE(dy.numel() == rows * channels_ && mean_.defined() && mean_.numel() == rows,
                    "layernorm ", name(), ": dy ", dy.shape(), " without a forward of its shape");
    if (rows == 0) return;
    cudaStream_t stream = CudaContext::For(dy.device()).stream();
    const float* w = affine_ ? parameters()[0].value.data<float>() : nullptr;
    if (dx[0] != nullptr) {
      CheckGpuF32(*dx[0], StrCat("layernorm '", name(), "' dx"));
      LayerNormBackwardData<<<CudaBlocks(rows), kCudaThreads, 0, stream>>>(
          in.data<float>(), dy.data<float>(), w, mean_.data<float>(), rstd_.data<float>(),
          dx[0]->data<float>(), rows, channels_, positions_);
      CNNFLOW_CUDA_CHECK_LAUNCH();
    }
    if (affine_) {
      LayerNormParamGrads<<<static_cast<unsigned>(channels_), kReduceThreads, 0, stream>>>(
          in.data<float>(), dy.data<float>(), mean_.data<float>(), rstd_.data<float>(),
          parameters()[0].grad.data<float>(), parameters()[1].grad.data<float>(), rows, channels_,
          positions_);
      CNNFLOW_CUDA_CHECK_LAUNCH();
    }
  }
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(layernorm, CudaLayerNormLayer);

}  // namespace cnnflow
