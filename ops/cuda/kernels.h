// The CUDA backend's entry points behind the device seam
// (ops/device_ops.h, which alone calls them outside ops/cuda/). Plain C++:
// no CUDA types, so ops/ can include it in any build; a build without CUDA
// throws from each (ops/cuda/device_stub.cc). Every call issues work on the
// tensors' GPU's compute stream (ops/cuda/context.h) and returns without
// waiting, unless it says otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops/device_ops.h"
#include "ops/loss.h"
#include "ops/tensor.h"

namespace cnnflow::cuda {

// y += alpha * x (same shape, dtype f32, f16 or bf16, same GPU; half
// precision is computed in f32 and rounded once).
void Axpy(float alpha, const Tensor& x, Tensor& y);
// y *= alpha (f32).
void Scale(Tensor& y, float alpha);
// The relu layer's kernels (y may be x): y = max(x, 0), NaN -> 0; dx = dy
// where y > 0, else 0. Same shape and dtype (f32, f16, bf16), one GPU.
void Relu(const Tensor& x, Tensor& y);
void ReluBackward(const Tensor& y, const Tensor& dy, Tensor& dx);

// The math GPU `device`'s kernels may use from now on (ops/device_ops.h's
// SetGpuMath; held by its CudaContext).
void SetMath(Device device, const GpuMathOptions& math);

// Blocks until the calling thread's lane of `device` is idle.
void Synchronize(Device device);

// graph.deterministic's file of cuDNN picks (ops/cuda/cudnn_picks.h).
void SetCudnnPicksFile(const std::string& path, bool write);

// Mixed precision (graph.precision: bf16 | fp16; see ops/model.h).
// dst = src converted (f32, f16, bf16 in any direction; same element count,
// same GPU; round to nearest even).
void Cast(const Tensor& src, Tensor& dst);
// dst += src, src in f16/bf16/f32, dst f32 (a half-precision parameter
// gradient added into the f32 one).
void AddCast(const Tensor& src, Tensor& dst);
// Channels-last (graph.channels_last on GPUs): src and dst hold the same
// [N, C, H, W] tensor, one stored NCHW and the other NHWC; to_nhwc: src is
// the NCHW one. dst = src in dst's storage and dtype (f32, f16, bf16, as
// Cast), or with accumulate dst += src (dst f32: a weight gradient).
void ChangeLayout(const Tensor& src, Tensor& dst, bool to_nhwc, bool accumulate = false);
// Multiplies every f32 tensor by inv_scale in place and returns whether any
// element (before scaling) is inf or NaN; waits for the answer (as
// torch._amp_foreach_non_finite_check_and_unscale_). The tensors are on one GPU.
bool UnscaleAndFindNonFinite(const std::vector<Tensor*>& grads, float inv_scale);

// Softmax cross-entropy as ops/loss.h's, on GPU logits [N, K] (f32, f16 or
// bf16; computed in f32/f64 whatever the type; dlogits in the logits' type) with
// `labels` N int64 values in GPU memory, and with `mix` (mixup, cutmix) its
// N other labels and N weights in GPU memory too (the pointers of the
// LabelMix are device pointers; the struct itself is read on the host).
// Waits for the result (the loss and the count of correct rows come back to
// the host); a label outside [0, K) (or a mixed-in label outside it, a
// weight outside [0, 1]) is reported then, as the CPU's does.
LossResult SoftmaxCrossEntropy(const Tensor& logits, const int64_t* labels, Tensor* dlogits,
                               double grad_scale = -1, double label_smoothing = 0.0,
                               const LabelMix* mix = nullptr);

// The same without waiting: the loss and the correct count come back
// through pinned memory while the host goes on issuing backward; Get()
// waits for them (and reports a bad label then). A training step that reads
// its loss later keeps the GPU fed (no host sync per step).
class PendingLoss final : public ::cnnflow::PendingLoss {
 public:
  struct Impl;
  explicit PendingLoss(std::unique_ptr<Impl> impl);
  ~PendingLoss() override;
  PendingLoss(const PendingLoss&) = delete;
  PendingLoss& operator=(const PendingLoss&) = delete;
  bool ready() const override { return done_; }
  LossResult Get() override;

 private:
  std::unique_ptr<Impl> impl_;
  bool done_ = false;
  LossResult result_;
};
std::unique_ptr<PendingLoss> SoftmaxCrossEntropyAsync(const Tensor& logits, const int64_t* labels,
                                                      Tensor* dlogits, double grad_scale = -1,
                                                      double label_smoothing = 0.0,
                                                      const LabelMix* mix = nullptr);
// Its two halves (ops/device_ops.h's SoftmaxCrossEntropyInto, ReadBackLoss).
void SoftmaxCrossEntropyInto(void* result, const Tensor& logits, const int64_t* labels,
                             Tensor* dlogits, double grad_scale, double label_smoothing,
                             const LabelMix* mix);
std::unique_ptr<PendingLoss> ReadBackLoss(const void* result, Device device,
                                          const Shape& logits_shape, bool mixed);

// torch.optim.SGD's and Adam/AdamW's (decoupled) updates (ops/train/optimizer.h)
// of every slot, in a few kernel launches for all of them (multi-tensor
// apply), in two parts (ops/device_ops.h's Upload*Scalars, LaunchFused*Step):
// the step's scalars written to `scalars` (kFusedStepScalarBytes of GPU
// memory; Adam at step `step`, counted from 1), and the kernels that read
// them there.
void UploadSgdScalars(void* scalars, Device device, double lr, double momentum, double dampening,
                      bool nesterov, double weight_decay);
void LaunchSgdStep(Device device, const std::vector<ParamSlot>& slots, const void* scalars);
void UploadAdamScalars(void* scalars, Device device, double lr, double beta1, double beta2,
                       double eps, double weight_decay, bool decoupled, int64_t step);
void LaunchAdamStep(Device device, const std::vector<ParamSlot>& slots, const void* scalars);

// How long a GPU's compute stream sat idle between the end of one step's
// work and the start of the next (waiting for the host or the next batch):
// the data-wait share of a GPU run, measured on the GPU with events.
class IdleMeter final : public ::cnnflow::IdleMeter {
 public:
  explicit IdleMeter(Device device);
  ~IdleMeter() override;
  IdleMeter(const IdleMeter&) = delete;
  IdleMeter& operator=(const IdleMeter&) = delete;
  void EndOfWork() override;
  void StartOfWork() override;
  void Mark(GpuPhase phase) override;
  double idle_seconds() override;
  double busy_seconds(GpuPhase phase) override;
  void Reset() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A span of GPU time for the profiler (ops/trace.h): events on the
// device's compute stream around the work issued during its lifetime,
// recorded as a span of the lane "cuda:K" when the trace is read. Make one
// only while tracing is on; the first of a trace waits once for the stream
// (to tie the GPU's clock to the host's).
class GpuSpan {
 public:
  GpuSpan(Device device, const char* category, std::string name);
  ~GpuSpan();
  GpuSpan(const GpuSpan&) = delete;
  GpuSpan& operator=(const GpuSpan&) = delete;

 private:
  int device_;
  const char* category_;
  std::string name_;
  uint32_t session_;
  void* begin_ = nullptr;  // cudaEvent_t
};

}  // namespace cnnflow::cuda
