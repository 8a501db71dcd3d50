// The trainer: opens the data, builds the model and the optimizer from a
// RunConfig, then for each epoch runs the config's train graph and its eval
// graph through the executor. It writes the run folder
// <output.dir>/<name>-<time>/ as it goes: the logs (pipeline/run_files.h),
// checkpoints (pipeline/checkpoint_control.h) and, at the end,
// model.safetensors, the final weights named by layer.
#pragma once

#include <tbb/task_arena.h>

#include <functional>
#include <memory>
#include <string>

#include "pipeline/autotune.h"
#include "pipeline/checkpoint_control.h"
#include "pipeline/progress.h"
#include "pipeline/rank_times.h"
#include "pipeline/run_config.h"
#include "pipeline/run_files.h"
#include "pipeline/validate_report.h"
#include "stages/pass_state.h"
#include "stages/run_context.h"

namespace cnnflow {

struct EpochReport {
  int64_t epoch = 0;
  PassMetrics train, test;
  double lr = 0;
};

// Sees each batch at the end of a graph, with its pass's totals so far.
using BatchObserver = std::function<void(const BatchMessage&, const PassMetrics&)>;

// One pass for Trainer::RunPass: "train" or "eval" of `epoch`, from batch
// start_batch (a resumed epoch) to before stop_batch (0: the end; where a
// checkpoint is due), cut after max_batches (-1: the config's
// train.max_steps or eval_max_steps; 0: the whole set).
struct PassRequest {
  std::string pass = "train";
  int64_t epoch = 0;
  int64_t max_batches = -1;
  int64_t start_batch = 0, stop_batch = 0;
  BatchObserver observe;
};

class Trainer {
 public:
  // Opens data sets and builds the model (shape errors surface here).
  explicit Trainer(RunConfig config);
  ~Trainer();

  // Trains all epochs (from where Resume left, if called); writes the run
  // folder (under `run_dir` if given; only process 0 of an MPI job writes),
  // a checkpoint after each epoch and every train.checkpoint_every steps,
  // and one when a stop is requested. Returns the last epoch's report.
  EpochReport Train(const std::string& run_dir = "");
  // Continues the run in `run_dir` from its newest valid checkpoint:
  // weights, optimizer state, epoch, batch, step. The config must be the
  // one the checkpoint was written with (its hash is checked).
  void Resume(const std::string& run_dir);
  // One evaluation pass over the test set.
  PassMetrics Evaluate();
  // Runs `graph` once as the pass `request` names (the tuner and the
  // benchmarks run their own graphs through this too). A training pass
  // moves the run's step count.
  PassMetrics RunPass(const GraphSpec& graph, const PassRequest& request);
  // Loads weights (and BN buffers) by name from a safetensors file; with a
  // prefix, the tensors named prefix + name ("ema.": the weight average).
  void LoadWeights(const std::string& path, const std::string& prefix = "");

  Model& model() { return *model_; }
  ReplicaSet& replicas() { return *replicas_; }          // data parallel (no graph.pipeline)
  PipelineModel* pipeline() { return pipeline_.get(); }  // graph.pipeline, else null
  const RunContext& context() const { return run_; }
  RunControl& control() { return control_; }
  int64_t global_step() const { return at_.global_step; }  // optimizer steps done
  const RunConfig& config() const { return config_; }
  const std::string& run_dir() const { return run_dir_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  void set_progress(Progress* p) { progress_ = p; }
  // Observers of Train: each training batch at the end of the train graph
  // (`cnnflow train --dump-batches`), and each epoch's report once it is
  // logged and checkpointed (cnnflow.Run.fit in python/).
  void set_batch_observer(BatchObserver o) {
    run_.resident_rows_to_host = static_cast<bool>(o);  // device-resident rows come back for it
    batch_observer_ = std::move(o);
  }
  void set_epoch_observer(std::function<void(const EpochReport&)> o) {
    epoch_observer_ = std::move(o);
  }
  // The model instances, their optimizers and the weight average: what
  // checkpoints, model.safetensors and a state_dict hold.
  TrainedTensors Tensors();
  // Asks a running Train to stop after the current step (signal handlers).
  void RequestStop() { control_.stop_requested = true; }

  // A summary for `cnnflow validate` (pipeline/validate_report.h).
  std::string Describe() const;

 private:
  // The constructor's steps: the replicas or the pipeline's stages; the data
  // sets (checked against the model); steps per epoch and the LR schedule;
  // the weight average of an ema node.
  void BuildModel(MpiWorld& world);
  void OpenData();
  // data.device_resident: the training set onto the GPUs, or a line why not.
  void HoldDataOnGpus();
  void PlanSchedule();
  void TimeParamGroups();
  void BuildWeightAverage();
  // What each batch at the end of a pass is told to (the run's logs, the
  // autotuner, which may move the pass's knobs, the progress line).
  void OnBatch(Autotuner* tuner, const BatchMessage& m, PassState& pass);
  // A pass's ends: the pipeline's bubble and slowest stage, the totals of
  // every process, the bad records it skipped.
  void ReportPipeline(const PassState& pass);
  void GatherMetrics(PassState& pass);
  void ReportBadRecords(const PassState& pass);
  // The train pass of `epoch`, in segments that end at checkpoints.
  PassMetrics TrainEpoch(int64_t epoch);
  // Its evaluation and logs: the epoch's row, scalars and line.
  void FinishEpoch(int64_t epoch, EpochReport& report, double busy0, double reduce0,
                   double gpu_idle0);
  void ReportMemory(double train_seconds);
  // The GPU lanes the run computes in: each replica's, or each pipeline stage's.
  std::vector<GpuLane> GpuLanes() const;
  // The "timed span:" line (docs/outputs.md#what-a-run-prints).
  void ReportTimedSpan();
  void SaveCheckpoint(int64_t epoch, const PassMetrics& partial);
  void Say(const std::string& line) {
    if (progress_) progress_->Line(line);
  }
  // Replica 0's busy and reduction-wait seconds so far (CPU replicas; else
  // negative): read between passes only.
  std::pair<double, double> StepCounters() const;
  std::string ResolvedConfigText() const;
  std::string RunIdentityText() const;
  void ShareKernelPicks(MpiWorld& world);

  RunConfig config_;
  std::shared_ptr<void> thread_limit_;      // a tbb::global_control: the run's thread budget
  std::unique_ptr<tbb::task_arena> arena_;  // the graph runs in it, `threads` slots
  std::unique_ptr<CheckpointControl> checkpoints_;
  std::unique_ptr<ReplicaSet> replicas_;     // each with its optimizer
  std::unique_ptr<PipelineModel> pipeline_;  // instead, with graph.pipeline
  Model* model_ = nullptr;                   // replica 0's
  std::unique_ptr<LrSchedule> schedule_;
  RunControl control_;
  RunContext run_;                   // set by the constructor
  std::unique_ptr<PassState> pass_;  // the pass running, or the last one
  int64_t steps_per_epoch_ = 0;
  // train.epochs in passes: the last is cut to last_pass_batches_ when
  // epochs has a fraction (0: whole).
  int64_t passes_ = 0;
  int64_t total_steps_ = 0;
  int64_t last_pass_batches_ = 0;
  std::string run_dir_;
  bool resumed_ = false;
  // Where training stands (moved by Resume and each training pass).
  TrainPosition at_;
  Progress* progress_ = nullptr;
  std::string init_report_;
  // The timed span, airbench's: the whitening init's seconds (negative
  // where no layer is initialised from the data), then the steady clock's
  // seconds at the start of Train's epochs and at the end of its last pass.
  double whiten_seconds_ = -1;
  double span_start_ = 0, span_end_ = 0;
  std::unique_ptr<Autotuner> autotuner_;  // graph.autotune
  std::unique_ptr<WeightAverage> ema_;    // an ema node in the train graph
  bool ema_eval_ = false;                 // evaluate on the average
  bool ema_lookahead_ = false;            // the average copied into the weights
  std::unique_ptr<RunFiles> files_;       // process 0 during Train
  RankTimes rank_times_;                  // each rank's step phases over the epoch
  BatchObserver batch_observer_;
  std::function<void(const EpochReport&)> epoch_observer_;
};

}  // namespace cnnflow
