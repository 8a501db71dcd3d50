// Pipeline model parallelism: the model's layers cut into S stages, each
// with its own thread share (a task arena: one "device"), fed by M
// micro-batches per batch. Stage s runs its actions -- forward or backward
// of micro-batch i -- in the order of the schedule:
//   gpipe: every forward, then every backward (a stage holds M
//          micro-batches of activations);
//   1f1b:  S - s - 1 forwards to fill the pipe, then one forward and one
//          backward in turn, then the remaining backwards (a stage holds at
//          most S - s <= S micro-batches).
// An action waits for its input: forward (s, i) for forward (s - 1, i),
// backward (s, i) for backward (s + 1, i). The step's driver (the
// pipeline_stage nodes of a train graph, one per stage, passing
// micro-batches on as messages) runs the actions; this class holds the
// stages and does the work of each action.
//
// Gradients of the micro-batches add up (each scaled by 1 / batch), then
// every stage's optimizer steps once: the same update as the unsplit model
// on the whole batch -- except BatchNorm, whose statistics are those of
// each micro-batch (as in GPipe), i.e. the unsplit model accumulating over
// the same M micro-batches.
//
// Each stage keeps one model instance per micro-batch it may hold at once
// (activations and per-forward layer state live in the instance); all
// instances, and the full model that checkpoints use, share the same
// parameter, gradient and buffer storage. Evaluation runs the stages in
// turn (Infer).
//
// On GPUs each stage works in its own lane (ops/device.h): its own stream,
// handles and pool, several stages possibly on one GPU. A stage's input
// from the stage before, and the gradient it sends back, cross lanes as
// ops/stream_event.h says: the receiver's stream waits for the sender's
// event and copies the tensor into its own lane, so no host waits inside a
// step and no block is reused while another lane still reads it.
#pragma once

#include <tbb/task_arena.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ops/device_ops.h"
#include "ops/loss.h"
#include "ops/model.h"
#include "ops/train/optimizer.h"

namespace cnnflow {

class MpiWorld;

enum class PipelineSchedule { kGpipe, kOneFOneB };
PipelineSchedule ParsePipelineSchedule(const std::string& name);  // "gpipe", "1f1b"
const char* PipelineScheduleName(PipelineSchedule schedule);

struct PipelineAction {
  bool forward = true;
  int microbatch = 0;
};
// Stage `stage`'s actions, in order.
std::vector<PipelineAction> StageSchedule(PipelineSchedule schedule, int stage, int stages,
                                          int microbatches);

// Where a pipeline may cut the model: CutPoints()[p] is true when one
// tensor crosses a cut before layer p, layer p-1's output (between residual
// blocks, not inside one: there the skip connection crosses too). p in
// [1, n).
std::vector<bool> CutPoints(const Model& model);
// Cuts the model's layers at cut points into `stages` contiguous runs of
// about equal forward FLOPs (the most expensive stage as cheap as
// possible); ConfigError when the model has too few cut points.
std::vector<std::vector<std::string>> BalancedCut(const Model& model, int stages);

struct PipelineOptions {
  std::vector<std::vector<std::string>> stages;  // layer names per stage
  int microbatches = 4;
  PipelineSchedule schedule = PipelineSchedule::kOneFOneB;
  int threads_per_stage = 1;
  bool flush_denormals = true;   // stages' kernels flush denormals (cpu::MakeComputeArena)
  bool fuse_activations = true;  // graph.fuse_activations (ModelOptions)
  // Each stage's device (empty: every stage on the host). A GPU listed k
  // times holds k stages, lanes 0..k-1 in the order listed.
  std::vector<Device> devices;
  std::optional<DType> compute;  // the activations' type on GPUs (graph.precision: bf16)
  GpuMathOptions gpu_math;       // graph.tf32, graph.deterministic
};

class PipelineModel {
 public:
  // Builds the full model (so parameters start as the unsplit model's) and
  // the stages; throws ConfigError when the cut is not contiguous, misses
  // or repeats a layer, or a layer reads across a cut other than the
  // previous stage's output.
  PipelineModel(const std::vector<LayerSpec>& layers, const Shape& input_shape, uint64_t seed,
                InitScheme init, const OptimizerSpec& optimizer, PipelineOptions options);
  ~PipelineModel();

  int num_stages() const { return static_cast<int>(stages_.size()); }
  const PipelineOptions& options() const { return options_; }
  Model& full() { return *full_; }
  Model& stage_model(int s);
  Device device(int s) const;
  int lane(int s) const;
  Optimizer& optimizer(int s);
  const std::vector<std::string>& stage_layers(int s) const { return options_.stages[s]; }

  struct Result {
    double loss_sum = 0;
    int64_t correct = 0;
    // GPUs: the batch's mean loss and correct count on their way back from
    // the last stage's GPU (loss_sum and correct are then 0).
    std::shared_ptr<PendingLoss> pending;
  };
  // One optimizer step on a batch: BeginStep cuts it into micro-batches
  // (returns how many: fewer than options().microbatches when the batch is
  // smaller), the driver runs every action of the schedule, then each
  // stage steps (Step); stages are independent once their own actions are
  // done.
  int BeginStep(const Tensor& x, const int64_t* labels, const ForwardContext& ctx,
                double grad_scale, double label_smoothing);
  void Forward(int stage, int microbatch);
  void Backward(int stage, int microbatch);
  // In an MPI job each process holds a data-parallel replica of the
  // pipeline: stage s's gradients (one flat buffer) are summed over the
  // processes between its last backward and its step. Every process starts
  // them in the same order (stage S-1 first: each stage's last backward
  // waits for the next stage's).
  void StartGradientSum(int stage, MpiWorld& world);
  void FinishGradientSum(int stage, MpiWorld& world, double timeout_s);
  // Steps stage s's optimizer with its gradients, then zeroes them.
  void Step(int stage, double lr);
  // The step's loss and correct count, once the last stage has run every
  // forward.
  Result StepResult() const;
  // Evaluation: x ([N, ...], anywhere) through every stage in turn, on the
  // calling thread and its lane of each stage's device; the logits are on
  // the last stage's device.
  Tensor Infer(const Tensor& x, const ForwardContext& ctx);
  // Waits until every stage's lane has done all that was issued (GPUs):
  // between passes, where the host reads and writes the weights from lane
  // 0 (checkpoints, init from data) and evaluation runs in it.
  void Synchronize();
  // Before a pass: Synchronize (after the host's writes between passes),
  // then ResetStats.
  void StartPass() {
    Synchronize();
    ResetStats();
  }

  // Accounting since the last ResetStats: busy seconds per stage (a GPU
  // stage's as its stream spent them, once Synchronize'd), and the most
  // micro-batches of activations a stage held at once.
  std::vector<double> busy_seconds() const;
  std::vector<int> max_held() const;
  double step_seconds() const { return step_seconds_; }  // BeginStep to the last Step, summed
  // Measured idle share of each stage (a GPU stage's: its stream's idle
  // time over its busy and idle time), and the schedule's theoretical
  // bubble (S - 1) / (M + S - 1).
  std::vector<double> bubble() const;
  double theoretical_bubble() const;
  void ResetStats();

 private:
  struct Stage;
  Tensor Receive(Stage& to, const Tensor& t) const;
  PipelineOptions options_;
  std::unique_ptr<Model> full_;
  std::vector<std::unique_ptr<Stage>> stages_;
  // The step in progress.
  Tensor x_;
  const int64_t* labels_ = nullptr;
  ForwardContext ctx_;
  double grad_scale_ = 0, label_smoothing_ = 0;
  int m_ = 0;
  std::vector<int64_t> begin_;  // micro-batch i: rows [begin_[i], begin_[i + 1])
  std::vector<Result> results_;
  std::chrono::steady_clock::time_point step_begin_;
  std::atomic<int> stepped_{0};  // stages stepped in this step
  double step_seconds_ = 0;
};

}  // namespace cnnflow
