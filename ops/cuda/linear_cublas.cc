// The linear layer on a GPU: cuBLAS sgemm on the device's compute stream,
// same semantics as ops/cpu/linear.cc (y = x W^T + b, W [out, F]).
//
// cuBLAS is column-major: a row-major [r, c] matrix is, to cuBLAS, the
// column-major [c, r] matrix (its transpose) with leading dimension c. So
//   Y = X W^T          is  Y^T[out, N] = W[out, F] X^T[F, N]:   sgemm(T, N)
//   dX = dY W          is  dX^T[F, N] = W^T[F, out] dY^T[out, N]: sgemm(N, N)
//   dW += dY^T X       is  dW^T[F, out] += X^T[F, N] dY[N, out]: sgemm(N, T)
// with every operand passed as stored.
#include <climits>

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/linear.h"

namespace cnnflow {
namespace {

void CheckGpuF32(const Tensor& t, const std::string& layer, const char* what, Device device) {
  if (t.device() != device) {
    throw Error(StrCat("linear '", layer, "': ", what, " is on ", t.device().ToString(),
                       ", the layer on ", device.ToString()));
  }
  if (t.dtype() != DType::kF32) {
    throw Error(StrCat("linear '", layer, "': ", what, " is ", DTypeName(t.dtype()),
                       "; the CUDA linear layer takes f32 only"));
  }
  CNNFLOW_ENFORCE(t.is_contiguous(), "linear '", layer, "': ", what, " ", t.shape(),
                  " is not contiguous");
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
    CheckGpuF32(in, name(), "input", dev);
    CheckGpuF32(y, name(), "output", dev);
    const int64_t n = in.dim(0), f = in_features(), out = out_features();
    CNNFLOW_ENFORCE(in.numel() == n * f && y.numel() == n * out, "linear ", name(), ": input ",
                    in.shape(), " output ", y.shape());
    if (n == 0) return;
    CudaContext& c = CudaContext::For(dev);
    const float* w = parameters()[0].value.data<float>();
    float* ys = y.data<float>();
    float beta = 0.f;
    if (has_bias()) {
      // Y = b broadcast, then Y += X W^T (as the CPU).
      cuda::BroadcastRows(parameters()[1].value.data<float>(), ys, n, out, c.stream());
      beta = 1.f;
    }
    const float alpha = 1.f;
    CNNFLOW_CUBLAS_CHECK(cublasSgemm(
        c.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, CheckedInt(out, name(), "out"),
        CheckedInt(n, name(), "N"), CheckedInt(f, name(), "in"), &alpha, w, static_cast<int>(f),
        in.data<float>(), static_cast<int>(f), &beta, ys, static_cast<int>(out)));
  }

  void Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    const Tensor& in = *x[0];
    Parameter& wp = parameters()[0];
    const Device dev = wp.value.device();
    CheckGpuF32(in, name(), "input", dev);
    CheckGpuF32(dy, name(), "dy", dev);
    const int64_t n = in.dim(0), f = in_features(), out = out_features();
    CNNFLOW_ENFORCE(dy.numel() == n * out, "linear ", name(), ": dy ", dy.shape());
    if (dx[0] != nullptr) {
      CheckGpuF32(*dx[0], name(), "dx", dev);
      CNNFLOW_ENFORCE(dx[0]->numel() == n * f, "linear ", name(), ": dx ", dx[0]->shape());
    }
    if (n == 0) return;
    CudaContext& c = CudaContext::For(dev);
    const int ni = CheckedInt(n, name(), "N"), fi = CheckedInt(f, name(), "in"),
              oi = CheckedInt(out, name(), "out");
    const float one = 1.f, zero = 0.f;
    const float* g = dy.data<float>();
    const float* xs = in.data<float>();
    const float* w = wp.value.data<float>();
    if (dx[0] != nullptr) {
      // dX^T[F, N] = W^T[F, out] dY^T[out, N].
      CNNFLOW_CUBLAS_CHECK(cublasSgemm(c.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, fi, ni, oi, &one, w,
                                       fi, g, oi, &zero, dx[0]->data<float>(), fi));
    }
    // dW^T[F, out] += X^T[F, N] dY[N, out].
    CNNFLOW_CUBLAS_CHECK(cublasSgemm(c.cublas(), CUBLAS_OP_N, CUBLAS_OP_T, fi, oi, ni, &one, xs, fi,
                                     g, oi, &one, wp.grad.data<float>(), fi));
    if (has_bias()) {
      // db[out] += the column sums of dY[N, out], in row order (bitwise the CPU's).
      cuda::AddColumnSums(g, parameters()[1].grad.data<float>(), n, out, c.stream());
    }
  }
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(linear, CudaLinearLayer);

}  // namespace cnnflow
