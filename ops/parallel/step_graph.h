// A GPU replica's training steps as CUDA graphs (graph.cuda_graph), as
// torch.cuda.graphs and MLPerf's ResNets run them: once a step of one shape
// has run `warmup` times in a row (cuDNN has picked its algorithms, the
// pools and workspaces have grown), the next one is captured: its forward
// and loss as one graph, its backward as another (two, so that the GPU's
// phase times stay apart), and the optimizer's update as a third (below).
// Later steps of that shape copy their rows and labels into the capture's
// input buffers and replay the graphs: three launches instead of one per
// kernel. A step of another shape (an epoch's short last batch, a new
// window scale) runs as before, beside the graphs.
//
// What a replay needs, and how it gets it:
//  - fixed addresses: the capture's blocks are reserved in the lane's pool
//    (ops/device.h's MemoryPool::Reserve), so nothing else is handed them
//    while the graphs live; the inputs are copied into buffers of the
//    capture's own;
//  - the same kernel arguments: the graphs are keyed by everything a step's
//    arguments depend on (the rows' shape, the loss's scale and label
//    smoothing, a label mix, and which parameters take gradients: a group
//    held past its until_epoch changes the backward);
//  - no host work inside: the loss comes back by a read-back issued after
//    the forward's replay (each step's into its own pinned slot), and the
//    GPU's idle meter marks the phases between the replays.
//
// Not captured, with the reason in why_not(): more than one replica (the
// gradient reduction runs on communication threads), tensor parallelism,
// fp16 (its loss scaler reads the gradients' check on the host each step),
// a layer that draws new random numbers each step (dropout). While --trace
// records, steps run uncaptured (it times each kernel).
//
// The optimizer's update (its fused multi-tensor launches, and the
// gradients' zeroing) is a third graph, captured at the first step after
// the forward and backward were: its kernels read the learning rate and
// the other scalars from GPU memory that Optimizer::Prepare writes before
// each replay (ops/train/optimizer.h), so a schedule's rates reach it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ops/device_ops.h"
#include "ops/loss.h"
#include "ops/model.h"
#include "ops/train/optimizer.h"

namespace cnnflow {

// What a captured step's kernel arguments depend on: steps of one key
// replay one capture.
struct StepKey {
  Shape shape;  // the rows'
  DType dtype = DType::kF32;
  double grad_scale = 0, label_smoothing = 0;
  bool mixed = false;            // a label mix (mixup, cutmix)
  std::vector<char> needs_grad;  // of each parameter
  bool operator==(const StepKey& o) const;
};

// When StepGraph captures: a key is captured once it has run `warmup` steps
// in a row, and replayed from then on, until another key does the same
// (one capture at a time); a key between (an epoch's short last batch)
// runs uncaptured. After a failed capture nothing is captured again.
class CaptureSchedule {
 public:
  enum class Action { kRun, kCapture, kReplay };  // kRun: uncaptured
  explicit CaptureSchedule(int warmup);
  // After kCapture the caller captures, then calls Captured or Failed.
  Action Next(const StepKey& key);
  void Captured(const StepKey& key) { captured_ = key; }
  void Failed();
  bool has_capture() const { return captured_.has_value(); }

 private:
  int warmup_;
  std::optional<StepKey> last_, captured_;
  int runs_ = 0;  // steps of last_ in a row
  bool failed_ = false;
};

class StepGraph {
 public:
  // Why `model`'s steps cannot be captured with these settings ("" when
  // they can): `replicas` over all processes, `tensor_parallel` members per
  // group, `compute` the activations' dtype.
  static std::string WhyNot(const Model& model, int replicas, int tensor_parallel, DType compute);

  // For `model` on GPU `device`, made in the thread's lane of it (the one
  // the steps run in).
  StepGraph(Model& model, Device device, int warmup = 2);
  ~StepGraph();  // waits for the replays, then frees the reserved blocks
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Whether this step replays the graphs: true when they were captured for
  // its key, or are captured now because its key has run `warmup` times in
  // a row. false: run it as before (a capture that fails says why in
  // why_not(), and no step is captured again). x, labels and mix are on
  // the device; ctx is a training step's.
  bool Prepare(const Tensor& x, const int64_t* labels, const LabelMix* mix, double grad_scale,
               double label_smoothing, const ForwardContext& ctx);
  // After Prepare returned true: copies the step's inputs into the
  // capture's buffers, replays the forward and the loss, and issues the
  // loss's read-back.
  std::unique_ptr<PendingLoss> ReplayForward(const Tensor& x, const int64_t* labels,
                                             const LabelMix* mix);
  // Then the backward (gradients accumulate into the parameters' grads).
  void ReplayBackward();
  // The optimizer's step with learning rate `lr`, then `zero_grads`: its
  // host part now (Optimizer::Prepare), its launches and `zero_grads`
  // replayed once the forward and backward are captured (captured at the
  // first such step), else issued as they are.
  void Update(Optimizer& optimizer, double lr, const std::function<void()>& zero_grads);

  int64_t replayed_steps() const { return replayed_; }
  int64_t replayed_updates() const { return replayed_updates_; }
  int captures() const { return captures_; }
  // Why steps are no longer captured ("" while they may be).
  const std::string& why_not() const { return why_not_; }

 private:
  StepKey KeyOf(const Tensor& x, const LabelMix* mix, double grad_scale,
                double label_smoothing) const;
  void Capture(const StepKey& key, const ForwardContext& ctx);
  // Waits for the replays, drops the graphs and frees their reservation.
  void Drop();
  // A capture failed: Drop, and no step is captured again.
  void Fail(const std::string& why);

  Model& model_;
  Device device_;
  MemoryPool& pool_;  // the lane's
  CaptureSchedule schedule_;
  bool mixed_ = false;  // the capture's key has a label mix
  int reservation_ = 0;
  std::unique_ptr<GpuGraph> forward_, backward_, update_;
  // The capture's own: its inputs, the loss gradient, the loss result.
  Tensor x_, labels_, mix_other_, mix_weight_, dlogits_;
  std::unique_ptr<Storage> result_;
  Shape logits_shape_;
  int64_t replayed_ = 0, replayed_updates_ = 0;
  int captures_ = 0;
  std::string why_not_;
};

}  // namespace cnnflow
