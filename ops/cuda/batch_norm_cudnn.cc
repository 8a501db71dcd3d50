// cuDNN kernels of batchnorm (the CUDA class of ops/layers/batch_norm.h), with the
// CPU layer's semantics, in CUDNN_BATCHNORM_SPATIAL mode (statistics per
// channel over N and every spatial position):
//  - samples [C, H, W] run as [N, C, H, W]; [C, L] as [N, C, 1, L]; [C] as
//    [N, C, 1, 1] (one value per sample and channel);
//  - training: cudnnBatchNormalizationForwardTraining with
//    exponentialAverageFactor = momentum (running = (1 - momentum) * running
//    + momentum * batch statistic); cuDNN updates the running variance with
//    the unbiased batch variance, as the CPU layer (and PyTorch) do. The
//    batch mean and inverse standard deviation are kept for backward;
//  - evaluation: cudnnBatchNormalizationForwardInference on the running
//    statistics; its backward is the affine map with those constants, built
//    from cuDNN calls (cuDNN's backward is the training one only);
//  - parameter gradients are ADDED (betaParamDiff = 1); affine: false uses
//    device constants weight 1 / bias 0 and a scratch for the unwanted
//    parameter gradients;
//  - SyncBN (ForwardContext::sync_sum, graph.sync_bn) and a fused ReLU
//    (FuseRelu, channels-last only): training forward and backward run our
//    kernels (ops/cuda/batch_norm_kernels.h) instead, SyncBN's on the
//    global batch's statistics. In evaluation a fused ReLU runs after
//    cuDNN's inference, in place, and masks dy before the affine backward.
//    Channels-last with an add as its only reader (DeferToReader), a
//    training forward computes the statistics only and the add normalises
//    (NormaliseAdd); backward is unchanged (it never reads y).
// Running buffers are updated in place on the device.
// Channels-last (Layer::SetChannelsLast: [N, C, H, W] stored NHWC): the same
// calls on NHWC descriptors; the statistics stay [C].
// Mixed precision: x, y, dy, dx are f16 or bf16, while the weight, bias,
// their gradients, the running and the saved statistics stay f32 (cuDNN's
// bnScaleBiasMeanVarDesc is f32 for half data: cudnnDeriveBNTensorDescriptor
// says so, and Prepare checks it), so cuDNN reads and ADDS the f32
// parameters and gradients directly. The evaluation backward's parameter
// gradients run on f32 copies of x and dy (see EvalBackward).
#include <cudnn.h>

#include <climits>
#include <string>
#include <vector>

#include "ops/cuda/batch_norm_kernels.h"
#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cudnn_util.h"
#include "ops/cuda/kernels.h"
#include "ops/layers/batch_norm.h"

namespace cnnflow {

namespace detail {

std::vector<int64_t> BatchNormCudnnDims(const std::vector<int64_t>& shape) {
  switch (shape.size()) {
    case 2:
      return {shape[0], shape[1], 1, 1};
    case 3:
      return {shape[0], shape[1], 1, shape[2]};
    case 4:
      return shape;
    default:
      return {};
  }
}

}  // namespace detail

namespace {

using detail::kCudnnOne;
using detail::kCudnnZero;
constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL;

class BatchNormCudnn : public BatchNormLayer, public cuda::DeferredNormalise {
 public:
  using BatchNormLayer::BatchNormLayer;
  // Our kernels take the ReLU (ops/cuda/batch_norm_kernels.h): channels-last
  // only, where they read x in full warps; an NCHW BN keeps cuDNN's kernels
  // and the relu stays a layer. Model fuses after choosing the layouts.
  bool FuseRelu() override {
    fused_relu_ = nhwc_input();
    return fused_relu_;
  }
  bool FuseGelu() override { return false; }
  // Channels-last: its add reader normalises (ops/cuda/batch_norm_kernels.h).
  bool DeferToReader() override {
    deferred_ = nhwc_input() && !fused_relu_;
    return deferred_;
  }
  bool NormaliseAdd(const Tensor& residual, Tensor& y, bool relu) override;
  ~BatchNormCudnn() override {
    for (auto* d : {x_desc_, x32_desc_, bn_desc_}) {
      if (d) cudnnDestroyTensorDescriptor(d);
    }
    if (mul_desc_) cudnnDestroyOpTensorDescriptor(mul_desc_);
  }

  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;

 private:
  const std::string& Label() const { return label_.Of(*this); }
  // Checks x, sets the descriptors for its shape (when it changed) and
  // makes the device state (first call on a device).
  void Prepare(const Tensor& x);
  const void* Scale() { return affine() ? parameters()[0].value.raw_data() : ones_.raw_data(); }
  const void* Bias() { return affine() ? parameters()[1].value.raw_data() : zeros_.raw_data(); }
  void EvalBackward(CudaContext& ctx, const Tensor& x, const Tensor& dy, Tensor* dx);
  cuda::BnShape KernelShape(const Tensor& x) const {
    return {x.dim(0), channels(), dims_[2] * dims_[3], nhwc_};
  }
  cuda::BnAffine KernelAffine() const {
    return {affine() ? parameters()[0].value.data<float>() : nullptr,
            affine() ? parameters()[1].value.data<float>() : nullptr, fused_relu_};
  }

  cudnnTensorDescriptor_t x_desc_ = nullptr;    // x, y, dy, dx (their dtype)
  cudnnTensorDescriptor_t x32_desc_ = nullptr;  // the same dims in f32
  cudnnTensorDescriptor_t bn_desc_ = nullptr;   // [1, C, 1, 1] f32
  cudnnOpTensorDescriptor_t mul_desc_ = nullptr;
  std::vector<int64_t> dims_;  // what x_desc_ describes
  DType dtype_ = DType::kF32;  // and in which type
  bool nhwc_ = false;          // and layout
  // Device state, [C] f32 each: constants for affine: false and for the
  // evaluation backward, the forward's batch statistics, and a scratch for
  // parameter gradients nobody wants ([2C]).
  Tensor ones_, zeros_, save_mean_, save_inv_std_, param_scratch_;
  bool fused_relu_ = false;  // FuseRelu
  bool deferred_ = false;    // DeferToReader
  // The last training forward's input when it left its output to the
  // reader (NormaliseAdd), until then.
  Tensor deferred_x_;
  // Our kernels' device state, and the last training forward's sync (null:
  // that forward was not synced).
  cuda::BnState kernel_state_;
  const std::function<void(float*, int64_t)>* last_sync_ = nullptr;
  // What the last forward did, for backward.
  bool last_training_ = false;
  bool last_ours_ = false;  // it ran our kernels
  int64_t last_n_ = -1;
  detail::LayerLabel label_;
};

void BatchNormCudnn::Prepare(const Tensor& x) {
  const int64_t c = channels();
  const cudnnDataType_t type = detail::CudnnDataTypeOf(x.dtype(), Label());
  CNNFLOW_ENFORCE(x.is_contiguous(), Label(), ": needs a contiguous input, got ", x.shape());
  const std::vector<int64_t> dims = detail::BatchNormCudnnDims(x.shape().dims());
  CNNFLOW_ENFORCE(!dims.empty() && dims[1] == c, Label(), ": expected [N, ", c,
                  ", ...] input (rank 2 to 4), got ", x.shape());
  for (int64_t d : dims) {
    CNNFLOW_ENFORCE(d <= INT_MAX, Label(), ": input ", x.shape(), " too large for cuDNN");
  }
  // cuDNN refuses a smaller epsilon (0.0 in cuDNN 9; the layer wants > 0).
  CNNFLOW_ENFORCE(eps() >= CUDNN_BN_MIN_EPSILON, Label(), ": eps ", eps(),
                  " is below cuDNN's minimum ", CUDNN_BN_MIN_EPSILON);
  const Device dev = x.device();
  if (x_desc_ == nullptr) {
    for (auto* d : {&x_desc_, &x32_desc_, &bn_desc_}) {
      CNNFLOW_CUDNN_CHECK(cudnnCreateTensorDescriptor(d));
    }
    CNNFLOW_CUDNN_CHECK(cudnnCreateOpTensorDescriptor(&mul_desc_));
    CNNFLOW_CUDNN_CHECK(cudnnSetOpTensorDescriptor(mul_desc_, CUDNN_OP_TENSOR_MUL, CUDNN_DATA_FLOAT,
                                                   CUDNN_PROPAGATE_NAN));
  }
  const bool nhwc = nhwc_input() && x.rank() == 4;
  if (dims != dims_ || x.dtype() != dtype_ || nhwc != nhwc_) {
    const int d[4] = {static_cast<int>(dims[0]), static_cast<int>(dims[1]),
                      static_cast<int>(dims[2]), static_cast<int>(dims[3])};
    const cudnnTensorFormat_t format = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    CNNFLOW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_desc_, format, type, d[0], d[1], d[2], d[3]));
    CNNFLOW_CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(x32_desc_, format, CUDNN_DATA_FLOAT, d[0], d[1], d[2], d[3]));
    CNNFLOW_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(bn_desc_, x_desc_, kMode));
    // The statistics and parameters are f32 whatever x is: cuDNN must agree.
    cudnnDataType_t bn_type = CUDNN_DATA_FLOAT;
    int n = 0, ch = 0, h = 0, w = 0, sn = 0, sc = 0, sh = 0, sw = 0;
    CNNFLOW_CUDNN_CHECK(
        cudnnGetTensor4dDescriptor(bn_desc_, &bn_type, &n, &ch, &h, &w, &sn, &sc, &sh, &sw));
    CNNFLOW_ENFORCE(bn_type == CUDNN_DATA_FLOAT, Label(), ": for ", DTypeName(x.dtype()),
                    " data cuDNN derives scale/bias/mean/var of cuDNN type ",
                    static_cast<int>(bn_type), ", not f32 (which this layer keeps them in)");
    dims_ = dims;
    dtype_ = x.dtype();
    nhwc_ = nhwc;
  }
  if (!ones_.defined() || ones_.device() != dev) {
    // Once per device (a blocking copy), never in the steady state.
    ones_ = Tensor::Full(Shape{c}, 1.0, DType::kF32).To(dev);
    zeros_ = Tensor::Zeros(Shape{c}, DType::kF32, dev);
    save_mean_ = Tensor::Zeros(Shape{c}, DType::kF32, dev);
    save_inv_std_ = Tensor::Zeros(Shape{c}, DType::kF32, dev);
    param_scratch_ = Tensor::Empty(Shape{2 * c}, DType::kF32, dev);
  }
  for (auto& b : buffers()) {
    CNNFLOW_ENFORCE(b.value.device() == dev && b.value.dtype() == DType::kF32, Label(), ": buffer ",
                    b.name, " is ", DTypeName(b.value.dtype()), " on ", b.value.device().ToString(),
                    ", the input on ", dev.ToString());
  }
  for (auto& p : parameters()) {
    CNNFLOW_ENFORCE(p.value.device() == dev && p.value.dtype() == DType::kF32, Label(),
                    ": parameter ", p.name, " is ", DTypeName(p.value.dtype()), " on ",
                    p.value.device().ToString(), ", the input on ", dev.ToString());
  }
}

void BatchNormCudnn::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                             const ForwardContext& ctx) {
  CNNFLOW_ENFORCE(x.size() == 1, Label(), " takes one input");
  const Tensor& in = *x[0];
  CudaContext& cuda = CudaContext::For(in.device());
  Prepare(in);
  CNNFLOW_ENFORCE(y.is_contiguous() && y.shape() == in.shape() && y.dtype() == in.dtype(), Label(),
                  ": output ", y.shape(), " does not match the input ", in.shape());
  const int64_t n = in.dim(0);
  const int64_t m = n * dims_[2] * dims_[3];  // values per channel
  // Held running statistics (a frozen BN) normalise as in evaluation.
  const bool training = ctx.training && !hold_running_stats();
  last_training_ = training;
  last_n_ = n;
  float* rmean = buffers()[0].value.data<float>();
  float* rvar = buffers()[1].value.data<float>();
  deferred_x_ = Tensor();
  if (!training) {
    last_ours_ = false;
    CNNFLOW_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
        cuda.cudnn(), kMode, &kCudnnOne, &kCudnnZero, x_desc_, in.raw_data(), x_desc_, y.raw_data(),
        bn_desc_, Scale(), Bias(), rmean, rvar, eps()));
    if (fused_relu_) cuda::Relu(y, y);
    return;
  }
  last_sync_ = ctx.sync_sum;
  if (ctx.sync_sum == nullptr && m <= 1) {  // (SyncBN's count is on the device only)
    throw Error(StrCat(
        Label(), ": expected more than 1 value per channel when training, got input ", in.shape()));
  }
  last_ours_ = ctx.sync_sum != nullptr || fused_relu_ || deferred_;
  if (last_ours_) {
    cuda::BatchNormTrainForward(KernelShape(in), in, deferred_ ? nullptr : &y, KernelAffine(),
                                rmean, rvar, momentum(), eps(), kernel_state_, ctx.sync_sum);
    if (deferred_) deferred_x_ = in;
    return;
  }
  CNNFLOW_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      cuda.cudnn(), kMode, &kCudnnOne, &kCudnnZero, x_desc_, in.raw_data(), x_desc_, y.raw_data(),
      bn_desc_, Scale(), Bias(), momentum(), rmean, rvar, eps(), save_mean_.raw_data(),
      save_inv_std_.raw_data()));
}

bool BatchNormCudnn::NormaliseAdd(const Tensor& residual, Tensor& y, bool relu) {
  if (!deferred_x_.defined()) return false;
  cuda::BnAffine a = KernelAffine();
  a.relu = relu;
  cuda::BatchNormNormalise(KernelShape(deferred_x_), deferred_x_, &residual, y, a, kernel_state_);
  deferred_x_ = Tensor();
  return true;
}

void BatchNormCudnn::Backward(const std::vector<const Tensor*>& x, const Tensor& y,
                              const Tensor& dy, const std::vector<Tensor*>& dx) {
  CNNFLOW_ENFORCE(x.size() == 1, Label(), " takes one input");
  const Tensor& in = *x[0];
  CudaContext& cuda = CudaContext::For(in.device());
  Prepare(in);
  CNNFLOW_ENFORCE(in.dim(0) == last_n_, Label(), ": backward without a matching forward, x ",
                  in.shape());
  CNNFLOW_ENFORCE(dy.is_contiguous() && dy.shape() == in.shape() && dy.dtype() == in.dtype(),
                  Label(), ": output gradient ", dy.shape(), " does not match the input ",
                  in.shape());
  Tensor* d = dx.empty() ? nullptr : dx[0];
  if (d != nullptr) {
    CNNFLOW_ENFORCE(d->is_contiguous() && d->shape() == in.shape() && d->dtype() == in.dtype(),
                    Label(), ": input gradient ", d->shape(), " does not match the input ",
                    in.shape());
  }
  if (d == nullptr && !affine()) return;  // nothing wanted
  if (!last_training_) {
    if (!fused_relu_) {
      EvalBackward(cuda, in, dy, d);
      return;
    }
    Tensor masked = Tensor::Empty(dy.shape(), dy.dtype(), dy.device());
    cuda::ReluBackward(y, dy, masked);
    EvalBackward(cuda, in, masked, d);
    return;
  }
  if (last_ours_) {
    cuda::BatchNormTrainBackward(KernelShape(in), in, dy, d, KernelAffine(),
                                 affine() ? parameters()[0].grad.data<float>() : nullptr,
                                 affine() ? parameters()[1].grad.data<float>() : nullptr,
                                 kernel_state_, last_sync_);
    return;
  }
  // cuDNN always writes dx: a pooled scratch when the caller wants none.
  Tensor scratch_dx;
  if (d == nullptr) {
    scratch_dx = Tensor::Empty(in.shape(), in.dtype(), in.device());
    d = &scratch_dx;
  }
  void* dscale = affine() ? parameters()[0].grad.raw_data() : param_scratch_.raw_data();
  void* dbias =
      affine() ? parameters()[1].grad.raw_data() : param_scratch_.data<float>() + channels();
  const float* beta_param = affine() ? &kCudnnOne : &kCudnnZero;  // accumulate real gradients
  CNNFLOW_CUDNN_CHECK(cudnnBatchNormalizationBackward(
      cuda.cudnn(), kMode, &kCudnnOne, &kCudnnZero, &kCudnnOne, beta_param, x_desc_, in.raw_data(),
      x_desc_, dy.raw_data(), x_desc_, d->raw_data(), bn_desc_, Scale(), dscale, dbias, eps(),
      save_mean_.raw_data(), save_inv_std_.raw_data()));
}

// The evaluation backward, with r = 1 / sqrt(running_var + eps):
//   dx = dy * weight * r                 (ForwardInference on dy, mean 0)
//   dweight += sum(dy * (x - running_mean) * r)
//   dbias += sum(dy)                     (sums over N and space:
//                                         cudnnConvolutionBackwardBias)
// The parameter gradients are computed on f32 x and dy (copies under mixed
// precision), so every call there sees f32 only: cuDNN's op-tensor and
// bias-sum calls are not documented for half data with f32 sums, and a
// backward in evaluation mode is rare.
void BatchNormCudnn::EvalBackward(CudaContext& cuda, const Tensor& x, const Tensor& dy,
                                  Tensor* dx) {
  cudnnHandle_t h = cuda.cudnn();
  float* rmean = buffers()[0].value.data<float>();
  float* rvar = buffers()[1].value.data<float>();
  if (dx != nullptr) {
    CNNFLOW_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
        h, kMode, &kCudnnOne, &kCudnnZero, x_desc_, dy.raw_data(), x_desc_, dx->raw_data(),
        bn_desc_, Scale(), zeros_.raw_data(), zeros_.raw_data(), rvar, eps()));
  }
  if (!affine()) return;
  Tensor x32 = x, dy32 = dy;
  if (x.dtype() != DType::kF32) {
    x32 = Tensor::Empty(x.shape(), DType::kF32, x.device());
    dy32 = Tensor::Empty(dy.shape(), DType::kF32, dy.device());
    cuda::Cast(x, x32);
    cuda::Cast(dy, dy32);
  }
  Tensor xhat = Tensor::Empty(x.shape(), DType::kF32, x.device());
  Tensor prod = Tensor::Empty(x.shape(), DType::kF32, x.device());
  CNNFLOW_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
      h, kMode, &kCudnnOne, &kCudnnZero, x32_desc_, x32.raw_data(), x32_desc_, xhat.raw_data(),
      bn_desc_, ones_.raw_data(), zeros_.raw_data(), rmean, rvar, eps()));
  CNNFLOW_CUDNN_CHECK(cudnnOpTensor(h, mul_desc_, &kCudnnOne, x32_desc_, xhat.raw_data(),
                                    &kCudnnOne, x32_desc_, dy32.raw_data(), &kCudnnZero, x32_desc_,
                                    prod.raw_data()));
  CNNFLOW_CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &kCudnnOne, x32_desc_, prod.raw_data(),
                                                   &kCudnnOne, bn_desc_,
                                                   parameters()[0].grad.raw_data()));
  CNNFLOW_CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &kCudnnOne, x32_desc_, dy32.raw_data(),
                                                   &kCudnnOne, bn_desc_,
                                                   parameters()[1].grad.raw_data()));
}

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(batchnorm, BatchNormCudnn);

}  // namespace cnnflow
