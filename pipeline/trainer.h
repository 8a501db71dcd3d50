// The trainer: opens the data, builds the model and the optimizer from a
// RunConfig, then for each epoch runs the config's train graph and its eval
// graph through the executor, writing the run folder as it goes:
//   <output.dir>/<name>-<time>/config.yaml     the resolved config
//                              metrics.csv     one row per epoch
//                              model.safetensors  final weights, named by layer
//                              autotune.csv    the autotuner's moves (graph.autotune)
//                              events.out.tfevents.*  TensorBoard scalars: every
//                                train.log_every steps (train/*) and per epoch (epoch/*)
//                              steps.csv       the train/* scalars, and each epoch's
//                                test loss and accuracy at its last step (cnnflow plot)
#pragma once

#include <tbb/task_arena.h>

#include <functional>
#include <memory>
#include <string>

#include "pipeline/autotune.h"
#include "pipeline/progress.h"
#include "pipeline/run_config.h"
#include "stages/run_state.h"

namespace cnnflow {

class AppendFile;
class TfEventWriter;

struct EpochReport {
  int64_t epoch = 0;
  PassMetrics train, test;
  double lr = 0;
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
  // Runs `graph` once as pass "train" or "eval" of `epoch` (the tuner runs
  // its own graphs through this too); `observe`, when given, sees each batch
  // at the end of the graph with the pass's totals so far.
  using BatchObserver = std::function<void(const BatchMessage&, const PassMetrics&)>;
  PassMetrics RunPass(const GraphSpec& graph, const std::string& pass, int64_t epoch,
                      const BatchObserver& observe = {});
  // Loads weights (and BN buffers) by name from a safetensors file; with a
  // prefix, the tensors named prefix + name ("ema.": the weight average).
  void LoadWeights(const std::string& path, const std::string& prefix = "");

  Model& model() { return *model_; }
  ReplicaSet& replicas() { return *replicas_; }          // data parallel (no graph.pipeline)
  PipelineModel* pipeline() { return pipeline_.get(); }  // graph.pipeline, else null
  RunState& state() { return state_; }
  const RunConfig& config() const { return config_; }
  const std::string& run_dir() const { return run_dir_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  void set_progress(Progress* p) { progress_ = p; }
  // Asks a running Train to stop after the current step (signal handlers).
  void RequestStop() { state_.stop_requested = true; }

  // A summary for `cnnflow validate` (pipeline/validate_report.h).
  std::string Describe() const;

 private:
  void BuildModel(MpiWorld& world);
  // train.init: the weights of config_.init_from into every model instance
  // (strict: all or an error listing each mismatch); what it did goes to
  // init_report_, printed when training starts.
  void InitFromWeights();
  void LogAutotune(const AutotuneDecision& d);
  // The train/* scalars of the batches since the last ones (TensorBoard).
  void LogStepScalars(int64_t step, const BatchMessage& m, const PassMetrics& p);
  // Replica 0's busy and reduction-wait seconds so far (CPU replicas; else
  // negative): read between passes only.
  std::pair<double, double> StepCounters() const;
  void SaveCheckpoint(int64_t epoch, const PassMetrics& partial);
  // What a run that fails writing its files (a full disk) can go on from.
  std::string ResumeAdvice() const;
  // Runs `write`, a write to the run folder (a log, a checkpoint); its Error
  // (a full disk) ends the run with ResumeAdvice added.
  void WriteRunFiles(const std::function<void()>& write);
  std::string ResolvedConfigText() const;
  std::vector<Model*> Models();  // every model instance that holds weights
  // What checkpoints and model.safetensors hold: the model's state, then
  // the weight average's ("ema.*"), if the graph has one.
  std::vector<std::pair<std::string, Tensor>> ExportedTensors();
  std::vector<Optimizer*> Optimizers();

  RunConfig config_;
  std::shared_ptr<void> thread_limit_;      // a tbb::global_control: the run's thread budget
  std::unique_ptr<tbb::task_arena> arena_;  // the graph runs in it, `threads` slots
  std::string config_hash_;
  std::unique_ptr<ReplicaSet> replicas_;     // each with its optimizer
  std::unique_ptr<PipelineModel> pipeline_;  // instead, with graph.pipeline
  Model* model_ = nullptr;                   // replica 0's
  std::unique_ptr<LrSchedule> schedule_;
  RunState state_;
  int64_t steps_per_epoch_ = 0;
  std::string run_dir_;
  // Where training stands (moved by Resume and Train).
  bool resumed_ = false;
  int64_t start_epoch_ = 0;
  int64_t batch_in_epoch_ = 0;
  int64_t checkpointed_step_ = -1;  // the newest checkpoint written or resumed from
  PassMetrics partial_train_;       // the resumed epoch's totals so far
  std::vector<std::vector<double>> metrics_rows_;
  Progress* progress_ = nullptr;
  std::string init_report_;
  std::unique_ptr<Autotuner> autotuner_;  // graph.autotune
  std::unique_ptr<WeightAverage> ema_;    // an ema node in the train graph
  bool ema_eval_ = false;                 // evaluate on the average
  std::unique_ptr<AppendFile> autotune_log_;
  std::unique_ptr<TfEventWriter> events_;  // rank 0 of a Train
  std::unique_ptr<AppendFile> steps_csv_;
  // The train/* scalars' window: the batches since the last ones (or the
  // epoch's start), summed batch by batch, so that where the epoch was cut
  // into segments (checkpoints, a stop and a resume) changes no bit of it;
  // a checkpoint carries it. Seconds: those of finished segments plus the
  // current segment's since `mark`; replica 0's counters at the last ones.
  struct ScalarWindow {
    double loss_sum = 0, seconds = 0, mark = 0, busy = -1, reduce_wait = 0;
    int64_t correct = 0, samples = 0;
  } window_;
  bool window_restored_ = false;  // Resume loaded window_ for the resumed epoch
};

}  // namespace cnnflow
