// The device seam (ops/device_ops.h): each call forks here to the host code
// or the CUDA backend.
#include "ops/device_ops.h"

#include "ops/cpu/elementwise.h"
#include "ops/cpu/onednn.h"
#include "ops/cuda/kernels.h"

namespace cnnflow {

void AddInPlace(Tensor& y, const Tensor& x) { Axpy(1.0, x, y); }

void Axpy(double alpha, const Tensor& x, Tensor& y) {
  CNNFLOW_ENFORCE(x.shape() == y.shape() && x.dtype() == y.dtype() && x.device() == y.device(),
                  "Axpy of ", x.shape(), " into ", y.shape());
  if (y.device().is_cuda()) return cuda::Axpy(static_cast<float>(alpha), x, y);
  cpu::Axpy(alpha, x, y);
}

void ScaleInPlace(Tensor& y, double alpha) {
  if (y.device().is_cuda()) return cuda::Scale(y, static_cast<float>(alpha));
  cpu::Scale(y, alpha);
}

void Cast(const Tensor& src, Tensor& dst) {
  if (src.device().is_cuda()) return cuda::Cast(src, dst);
  throw Error(StrCat("casting ", DTypeName(src.dtype()), " to ", DTypeName(dst.dtype()), " on ",
                     src.device().ToString(), ": mixed precision (graph.precision) is GPU-only"));
}

std::string NoNativeBf16OnHost() { return cpu::NoNativeBf16Reason(); }

bool UnscaleAndFindNonFinite(const std::vector<Tensor*>& grads, float inv_scale) {
  if (grads.empty() || grads[0]->device().is_cuda()) {
    return cuda::UnscaleAndFindNonFinite(grads, inv_scale);
  }
  throw Error(StrCat("unscaling gradients on ", grads[0]->device().ToString(),
                     ": the f16 loss scaler (graph.precision: fp16) is GPU-only"));
}

namespace {

// A host loss: known when made.
class KnownLoss final : public PendingLoss {
 public:
  explicit KnownLoss(LossResult r) : r_(r) {}
  bool ready() const override { return true; }
  LossResult Get() override { return r_; }

 private:
  LossResult r_;
};

}  // namespace

std::unique_ptr<PendingLoss> SoftmaxCrossEntropyAsync(const Tensor& logits, const int64_t* labels,
                                                      Tensor* dlogits, double grad_scale,
                                                      double label_smoothing, const LabelMix* mix) {
  if (!logits.device().is_cuda()) {
    return std::make_unique<KnownLoss>(
        SoftmaxCrossEntropy(logits, labels, dlogits, grad_scale, label_smoothing, mix));
  }
  return cuda::SoftmaxCrossEntropyAsync(logits, labels, dlogits, grad_scale, label_smoothing, mix);
}

void SoftmaxCrossEntropyInto(void* result, const Tensor& logits, const int64_t* labels,
                             Tensor* dlogits, double grad_scale, double label_smoothing,
                             const LabelMix* mix) {
  CNNFLOW_ENFORCE(logits.device().is_cuda(), "SoftmaxCrossEntropyInto: logits on ",
                  logits.device().ToString(), ", not a GPU");
  cuda::SoftmaxCrossEntropyInto(result, logits, labels, dlogits, grad_scale, label_smoothing, mix);
}

std::unique_ptr<PendingLoss> ReadBackLoss(const void* result, Device device,
                                          const Shape& logits_shape, bool mixed) {
  CNNFLOW_ENFORCE(device.is_cuda(), "ReadBackLoss: ", device.ToString(), " is not a GPU");
  return cuda::ReadBackLoss(result, device, logits_shape, mixed);
}

namespace {

void CheckScalars(const Tensor& scalars) {
  CNNFLOW_ENFORCE(scalars.device().is_cuda() && scalars.nbytes() >= kFusedStepScalarBytes,
                  "a fused optimizer step's scalars take ", kFusedStepScalarBytes,
                  " bytes on a GPU, got ", scalars.nbytes(), " on ", scalars.device().ToString());
}

}  // namespace

void UploadSgdScalars(Tensor& scalars, double lr, double momentum, double dampening, bool nesterov,
                      double weight_decay) {
  CheckScalars(scalars);
  cuda::UploadSgdScalars(scalars.raw_data(), scalars.device(), lr, momentum, dampening, nesterov,
                         weight_decay);
}

void LaunchFusedSgdStep(const std::vector<ParamSlot>& slots, const Tensor& scalars) {
  CheckScalars(scalars);
  cuda::LaunchSgdStep(scalars.device(), slots, scalars.raw_data());
}

void UploadAdamScalars(Tensor& scalars, double lr, double beta1, double beta2, double eps,
                       double weight_decay, bool decoupled, int64_t step) {
  CheckScalars(scalars);
  cuda::UploadAdamScalars(scalars.raw_data(), scalars.device(), lr, beta1, beta2, eps, weight_decay,
                          decoupled, step);
}

void LaunchFusedAdamStep(const std::vector<ParamSlot>& slots, const Tensor& scalars) {
  CheckScalars(scalars);
  cuda::LaunchAdamStep(scalars.device(), slots, scalars.raw_data());
}

void SetGpuMath(Device device, const GpuMathOptions& math) {
  if (device.is_cuda()) cuda::SetMath(device, math);
}

void SetGpuPicksFile(const std::string& path, bool write) { cuda::SetCudnnPicksFile(path, write); }

void SynchronizeDevice(Device device) {
  if (device.is_cuda()) cuda::Synchronize(device);
}

std::unique_ptr<IdleMeter> MakeIdleMeter(Device device) {
  if (!device.is_cuda()) return nullptr;
  return std::make_unique<cuda::IdleMeter>(device);
}

struct DeviceSpan::Impl {
  cuda::GpuSpan span;
};

void DeviceSpan::Begin(Device device, const char* category, std::string name) {
  impl_ = new Impl{cuda::GpuSpan(device, category, std::move(name))};
}

DeviceSpan::~DeviceSpan() { delete impl_; }

}  // namespace cnnflow
