// The linear layer on a GPU: cuBLAS sgemm on the device's compute stream,
// same semantics as ops/cpu/linear.cc (y = x W^T + b, W [out, F]).
//
// Mixed precision (x, y, dy, dx in f16 or bf16; W, b and their gradients
// f32): cublasGemmEx with half A and B and CUBLAS_COMPUTE_32F (f32
// accumulation) against a half copy of W refreshed at each Forward; dW is
// accumulated straight into the f32 gradient (GemmEx with an f32 C, a
// combination cuBLAS supports for CUDA_R_16F and CUDA_R_16BF inputs); db
// is the f32 column sums of the half dy.
//
// cuBLAS is column-major: a row-major [r, c] matrix is, to cuBLAS, the
// column-major [c, r] matrix (its transpose) with leading dimension c. So
//   Y = X W^T          is  Y^T[out, N] = W[out, F] X^T[F, N]:   sgemm(T, N)
//   dX = dY W          is  dX^T[F, N] = W^T[F, out] dY^T[out, N]: sgemm(N, N)
//   dW += dY^T X       is  dW^T[F, out] += X^T[F, N] dY[N, out]: sgemm(N, T)
// with every operand passed as stored.
#include <climits>

#include "ops/cuda/context.h"
#include "ops/cuda/cublas_api.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/kernels.h"
#include "ops/layers/linear.h"

namespace cnnflow {
namespace {

// A contiguous tensor of dtype `type` (the compute dtype: f32, f16 or bf16)
// on the layer's device.
void CheckGpuTensor(const Tensor& t, const std::string& layer, const char* what, Device device,
                    DType type) {
  if (t.device() != device) {
    throw Error(StrCat("linear '", layer, "': ", what, " is on ", t.device().ToString(),
                       ", the layer on ", device.ToString()));
  }
  if (type != DType::kF32 && type != DType::kF16 && type != DType::kBF16) {
    throw Error(StrCat("linear '", layer, "': ", what, " is ", DTypeName(t.dtype()),
                       "; the CUDA linear layer takes f32, f16 or bf16"));
  }
  if (t.dtype() != type) {
    throw Error(StrCat("linear '", layer, "': ", what, " is ", DTypeName(t.dtype()), ", the input ",
                       DTypeName(type)));
  }
  CNNFLOW_ENFORCE(t.is_contiguous(), "linear '", layer, "': ", what, " ", t.shape(),
                  " is not contiguous");
}

cudaDataType_t CublasType(DType t) {
  return t == DType::kF16 ? CUDA_R_16F : t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// cuBLAS takes int sizes.
int CheckedInt(int64_t v, const std::string& layer, const char* what) {
  if (v > INT_MAX) {
    throw Error(StrCat("linear '", layer, "': ", what, " = ", v, " is too large for cuBLAS"));
  }
  return static_cast<int>(v);
}

class CudaLinearLayer : public LinearLayer {
 public:
  using LinearLayer::LinearLayer;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    const Tensor& in = *x[0];
    const Device dev = parameters()[0].value.device();
    const DType type = in.dtype();
    CheckGpuTensor(in, name(), "input", dev, type);
    CheckGpuTensor(y, name(), "output", dev, type);
    const int64_t n = in.dim(0), f = in_features(), out = out_features();
    CNNFLOW_ENFORCE(in.numel() == n * f && y.numel() == n * out, "linear ", name(), ": input ",
                    in.shape(), " output ", y.shape());
    CudaContext& c = CudaContext::For(dev);
    if (type != DType::kF32) RefreshHalfWeight(type);
    if (n == 0) return;
    const int ni = CheckedInt(n, name(), "N"), fi = CheckedInt(f, name(), "in"),
              oi = CheckedInt(out, name(), "out");
    float beta = 0.f;
    if (has_bias()) {
      // Y = b broadcast, then Y += X W^T (as the CPU).
      cuda::BroadcastRows(parameters()[1].value.data<float>(), y.raw_data(), type, n, out,
                          c.stream());
      beta = 1.f;
    }
    const float alpha = 1.f;
    if (type == DType::kF32) {
      CNNFLOW_CUBLAS_CHECK(detail::Cublas().Sgemm(c.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, oi, ni, fi,
                                                  &alpha, parameters()[0].value.data<float>(), fi,
                                                  in.data<float>(), fi, &beta, y.data<float>(),
                                                  oi));
      return;
    }
    // Y^T[out, N] = W[out, F] X^T[F, N] in half with f32 accumulation.
    const cudaDataType_t h = CublasType(type);
    CNNFLOW_CUBLAS_CHECK(detail::Cublas().GemmEx(
        c.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, oi, ni, fi, &alpha, w_half_.raw_data(), h, fi,
        in.raw_data(), h, fi, &beta, y.raw_data(), h, oi, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  void Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    const Tensor& in = *x[0];
    Parameter& wp = parameters()[0];
    const Device dev = wp.value.device();
    const DType type = in.dtype();
    CheckGpuTensor(in, name(), "input", dev, type);
    CheckGpuTensor(dy, name(), "dy", dev, type);
    const int64_t n = in.dim(0), f = in_features(), out = out_features();
    CNNFLOW_ENFORCE(dy.numel() == n * out, "linear ", name(), ": dy ", dy.shape());
    if (dx[0] != nullptr) {
      CheckGpuTensor(*dx[0], name(), "dx", dev, type);
      CNNFLOW_ENFORCE(dx[0]->numel() == n * f, "linear ", name(), ": dx ", dx[0]->shape());
    }
    if (n == 0) return;
    CudaContext& c = CudaContext::For(dev);
    const int ni = CheckedInt(n, name(), "N"), fi = CheckedInt(f, name(), "in"),
              oi = CheckedInt(out, name(), "out");
    const float one = 1.f, zero = 0.f;
    if (type == DType::kF32) {
      const float* g = dy.data<float>();
      const float* xs = in.data<float>();
      const float* w = wp.value.data<float>();
      if (dx[0] != nullptr) {
        // dX^T[F, N] = W^T[F, out] dY^T[out, N].
        CNNFLOW_CUBLAS_CHECK(detail::Cublas().Sgemm(c.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, fi, ni,
                                                    oi, &one, w, fi, g, oi, &zero,
                                                    dx[0]->data<float>(), fi));
      }
      // dW^T[F, out] += X^T[F, N] dY[N, out].
      CNNFLOW_CUBLAS_CHECK(detail::Cublas().Sgemm(c.cublas(), CUBLAS_OP_N, CUBLAS_OP_T, fi, oi, ni,
                                                  &one, xs, fi, g, oi, &one, wp.grad.data<float>(),
                                                  fi));
    } else {
      const cudaDataType_t h = CublasType(type);
      if (dx[0] != nullptr) {
        // The half W of this step's Forward (the optimizer runs after Backward).
        CNNFLOW_ENFORCE(w_half_.defined() && w_half_.dtype() == type && w_half_.device() == dev,
                        "linear '", name(), "': backward in ", DTypeName(type),
                        " without a forward in it");
        CNNFLOW_CUBLAS_CHECK(detail::Cublas().GemmEx(
            c.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, fi, ni, oi, &one, w_half_.raw_data(), h, fi,
            dy.raw_data(), h, oi, &zero, dx[0]->raw_data(), h, fi, CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT));
      }
      // dW^T[F, out] (f32) += X^T[F, N] dY[N, out] (half), accumulated in f32.
      CNNFLOW_CUBLAS_CHECK(detail::Cublas().GemmEx(c.cublas(), CUBLAS_OP_N, CUBLAS_OP_T, fi, oi, ni,
                                                   &one, in.raw_data(), h, fi, dy.raw_data(), h, oi,
                                                   &one, wp.grad.data<float>(), CUDA_R_32F, fi,
                                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    if (has_bias()) {
      // db[out] += the column sums of dY[N, out], in row order (in f32: bitwise the CPU's).
      cuda::AddColumnSums(dy.raw_data(), type, parameters()[1].grad.data<float>(), n, out,
                          c.stream());
    }
  }

 private:
  // w_half_ = W rounded to `type`: the optimizer changes W between steps.
  void RefreshHalfWeight(DType type) {
    const Tensor& w = parameters()[0].value;
    if (!w_half_.defined() || w_half_.dtype() != type || w_half_.device() != w.device() ||
        w_half_.shape() != w.shape()) {
      w_half_ = Tensor::Empty(w.shape(), type, w.device());
    }
    cuda::Cast(w, w_half_);
  }

  Tensor w_half_;  // [out, F] in the compute dtype (mixed precision only)
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(linear, CudaLinearLayer);

}  // namespace cnnflow
