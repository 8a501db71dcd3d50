// The device seam: what device-neutral code (the model, the optimizers, the
// replicas, the stages) runs on tensors wherever they live. Each call forks
// in device_ops.cc, and only there, to the host code or to the CUDA
// backend (ops/cuda/kernels.h): nothing outside ops/cuda/ and
// device_ops.cc names cuda::. In a build without CUDA the backend is a stub
// that throws, and no GPU tensor can exist.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops/loss.h"
#include "ops/tensor.h"
#include "ops/trace.h"

namespace cnnflow {

// y += x; y += alpha * x; y *= alpha (same shape, dtype and device).
void AddInPlace(Tensor& y, const Tensor& x);
void Axpy(double alpha, const Tensor& x, Tensor& y);
void ScaleInPlace(Tensor& y, double alpha);

// dst = src in dst's dtype (same element count and device): a
// mixed-precision model's f32 batch cast to f16/bf16 (GPU only).
void Cast(const Tensor& src, Tensor& dst);

// Why this host cannot multiply in bf16 natively (cpu::NoNativeBf16Reason),
// or "" when it can: bf16 on CPU devices needs it.
std::string NoNativeBf16OnHost();

// Multiplies every gradient (f32, all on one GPU) by inv_scale in place;
// returns whether any element was inf or NaN before (the f16 loss scaler,
// GPU-only as graph.precision is).
bool UnscaleAndFindNonFinite(const std::vector<Tensor*>& grads, float inv_scale);

// Softmax cross-entropy (ops/loss.h) on logits wherever they are, the labels
// (and a mix's other labels and weights) in the same device's memory. On a
// GPU it returns at once and the loss follows (PendingLoss::ready() false
// until then), so the host goes on issuing backward; on the CPU it is
// computed now.
std::unique_ptr<PendingLoss> SoftmaxCrossEntropyAsync(const Tensor& logits, const int64_t* labels,
                                                      Tensor* dlogits, double grad_scale = -1,
                                                      double label_smoothing = 0.0,
                                                      const LabelMix* mix = nullptr);
// Its two halves, for a step captured as a CUDA graph (ops/parallel/step_graph.h),
// GPU only: SoftmaxCrossEntropyInto writes the result to `result` (GPU
// memory of kLossResultBytes that the caller keeps) and reads nothing back,
// so a replay rewrites it; ReadBackLoss then brings it back as a
// PendingLoss (issued after each replay, outside the graph: each step's
// loss lands in pinned memory of its own).
inline constexpr size_t kLossResultBytes = 64;
void SoftmaxCrossEntropyInto(void* result, const Tensor& logits, const int64_t* labels,
                             Tensor* dlogits, double grad_scale, double label_smoothing,
                             const LabelMix* mix);
std::unique_ptr<PendingLoss> ReadBackLoss(const void* result, Device device,
                                          const Shape& logits_shape, bool mixed);

// One parameter of an optimizer step fused over many tensors of one GPU:
// value, gradient and state (f32; state1 only for Adam). `first`: the state
// was just created and holds zeros (SGD's momentum buffer starts as the
// gradient).
struct ParamSlot {
  float* value = nullptr;
  const float* grad = nullptr;
  float* state0 = nullptr;  // SGD: momentum_buffer (null without momentum); Adam: exp_avg
  float* state1 = nullptr;  // Adam: exp_avg_sq
  int64_t numel = 0;
  bool first = false;
};
// torch.optim.SGD's and Adam/AdamW's updates (ops/train/optimizer.h) of every slot
// on a GPU, in a few kernel launches (multi-tensor apply), in two parts so
// that the launches can be captured in a CUDA graph (ops/parallel/step_graph.h):
// Upload*Scalars writes one step's scalars (the learning rate, the decay,
// Adam's bias corrections at step `step`, counted from 1) into `scalars`,
// GPU memory of kFusedStepScalarBytes (a tensor the optimizer keeps), on its
// GPU's stream; LaunchFused*Step issues the kernels, which read them there.
inline constexpr size_t kFusedStepScalarBytes = 64;
void UploadSgdScalars(Tensor& scalars, double lr, double momentum, double dampening, bool nesterov,
                      double weight_decay);
void LaunchFusedSgdStep(const std::vector<ParamSlot>& slots, const Tensor& scalars);
void UploadAdamScalars(Tensor& scalars, double lr, double beta1, double beta2, double eps,
                       double weight_decay, bool decoupled, int64_t step);
void LaunchFusedAdamStep(const std::vector<ParamSlot>& slots, const Tensor& scalars);

// How a GPU's kernels may compute, as PyTorch's switches (graph.tf32,
// graph.deterministic; docs/gpus.md):
//  - tf32: f32 convolutions may multiply in TF32 on tensor cores
//    (torch.backends.cudnn.allow_tf32, default true); false: full f32 (FMA)
//    math. f32 matmuls (cuBLAS) never use TF32 either way, as PyTorch's
//    default torch.backends.cuda.matmul.allow_tf32 = False;
//  - deterministic: cuDNN algorithms that give the same bits every run only
//    (torch.backends.cudnn.deterministic, torch.use_deterministic_algorithms),
//    and each convolution's pick kept in a file (SetGpuPicksFile) so that a
//    resume runs the same ones.
// A setting of the device's process-wide CUDA context: set it before the
// models on that GPU run their first step (ReplicaSet does). Nothing on a
// CPU device, whose kernels are deterministic and never TF32.
struct GpuMathOptions {
  bool tf32 = true;
  bool deterministic = false;
};
void SetGpuMath(Device device, const GpuMathOptions& math);
// graph.deterministic: the file that keeps the cuDNN picks of this process's
// GPUs (<run>/cudnn-picks.tsv; ops/cuda/cudnn_picks.h), loaded now when it
// exists; `write`: this process writes it. Nothing without CUDA.
void SetGpuPicksFile(const std::string& path, bool write);
// Blocks until the calling thread's lane of GPU `device` (ops/device.h) has
// done all that was issued on it; nothing for a CPU device.
void SynchronizeDevice(Device device);

// A CUDA graph: work issued to the calling thread's lane of a GPU (ops/device.h),
// captured once and launched again as one (ops/parallel/step_graph.h captures
// training steps with it). Capture runs `issue` with the lane's stream
// capturing, so no kernel runs then, and instantiates what it issued;
// Replay launches it on the stream, with the addresses and kernel
// arguments of the capture. Capture throws Error with CUDA's reason when
// the work cannot be captured, and leaves the stream as it was. Without
// CUDA, making one throws.
class GpuGraph {
 public:
  explicit GpuGraph(Device device);
  ~GpuGraph();  // after its replays have run
  GpuGraph(const GpuGraph&) = delete;
  GpuGraph& operator=(const GpuGraph&) = delete;
  void Capture(const std::function<void()>& issue);
  void Replay();
  bool captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// How long a device sat idle between the end of one step's work and the
// start of the next (waiting for the host or the next batch): the data-wait
// share of a GPU run, and where its busy time went (the phases of a step:
// forward from StartOfWork, then each Mark's), measured on the GPU with
// events. Null for a CPU (its idle time is the host's own wait, its phases
// the host's).
enum GpuPhase { kGpuForward, kGpuBackward, kGpuReduceWait, kGpuOptimizer, kGpuPhases };
class IdleMeter {
 public:
  virtual ~IdleMeter() = default;
  virtual void EndOfWork() = 0;    // after a step's last kernel was issued
  virtual void StartOfWork() = 0;  // before the next step's first kernel (forward)
  // From the next kernel on, the device's time counts to `phase`.
  virtual void Mark(GpuPhase phase) = 0;
  // Of the spans that have completed (never waits).
  virtual double idle_seconds() = 0;
  virtual double busy_seconds(GpuPhase phase) = 0;
  virtual void Reset() = 0;
};
std::unique_ptr<IdleMeter> MakeIdleMeter(Device device);

// The device's own time of the work issued during its lifetime, for the
// profiler: on a GPU a span of the lane "cuda:K" (events on its stream),
// while tracing is on; nothing on the CPU, whose TraceSpan is that time.
// `name` is called only when a span is made.
class DeviceSpan {
 public:
  template <typename Name>
  DeviceSpan(Device device, const char* category, Name&& name) {
    if (device.is_cuda() && Tracer::on()) Begin(device, category, std::string(name()));
  }
  ~DeviceSpan();
  DeviceSpan(const DeviceSpan&) = delete;
  DeviceSpan& operator=(const DeviceSpan&) = delete;

 private:
  struct Impl;
  void Begin(Device device, const char* category, std::string name);
  Impl* impl_ = nullptr;  // owned; raw so that the inline constructor needs no ~Impl
};

}  // namespace cnnflow
