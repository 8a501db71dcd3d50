// Checkpoint control for a training run: when a checkpoint is saved, what it
// holds, resuming from the newest, and train.init (weights from a file). The
// file format and its crash safety are pipeline/checkpoint.h's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ops/model.h"
#include "ops/train/optimizer.h"
#include "ops/train/weight_average.h"
#include "stages/pass_state.h"

namespace cnnflow {

// Where training stands, besides its tensors: what a checkpoint saves and a
// resume restores.
struct TrainPosition {
  int64_t epoch = 0;                              // completed epochs
  int64_t batch_in_epoch = 0;                     // batches of `epoch` already trained
  int64_t global_step = 0;                        // optimizer steps
  int64_t batches_done = 0;                       // batches over the whole run
  PassMetrics partial_train;                      // epoch `epoch`'s totals so far
  std::vector<std::vector<double>> metrics_rows;  // metrics.csv (RunFiles::MetricsColumns)
  std::string log_window;                         // RunFiles::WindowState
};

// The tensors a run trains: what a checkpoint saves and loads.
struct TrainedTensors {
  std::vector<Model*> models;  // every instance that holds weights; [0] is saved
  std::vector<Optimizer*> optimizers;
  // Replicas' optimizers hold identical state (optimizer 0's is saved); a
  // pipeline's stages hold one part each (all are saved).
  bool optimizers_identical = true;
  WeightAverage* ema = nullptr;  // the train graph's ema node, if any

  // What checkpoints and model.safetensors hold: the model's state, then the
  // weight average's ("ema.*").
  std::vector<std::pair<std::string, Tensor>> Exported() const;
};

class CheckpointControl {
 public:
  // `identity`: the run's (Trainer::RunIdentityText, YAML: the resolved
  // config less the layout), which a resume must match; `keep`: the newest
  // checkpoints kept (<= 0: all).
  CheckpointControl(std::string identity, uint64_t seed, int keep);

  // Loads the newest valid checkpoint of `run_dir` into `tensors` and returns
  // where it stands. Skipped newer checkpoints are told to `say`. Throws
  // when there is none, or when it was written by another run (naming the
  // keys that differ).
  TrainPosition Resume(const std::string& run_dir, const TrainedTensors& tensors,
                       const std::function<void(const std::string&)>& say);
  // Writes a checkpoint of `tensors` at `at` into `run_dir` (through Guard).
  void Save(const std::string& run_dir, const TrainPosition& at, const TrainedTensors& tensors);
  // Runs `write`, a write to the run folder; its Error (a full disk) ends the
  // run with what it can go on from: the newest checkpoint, if any.
  void Guard(const std::function<void()>& write) const;

 private:
  std::string ResumeAdvice() const;

  std::string identity_;
  std::string config_hash_;  // ConfigHash(identity_)
  uint64_t seed_;
  int keep_;
  std::string run_dir_;             // of the newest checkpoint written or resumed from
  int64_t checkpointed_step_ = -1;  // its step; -1: none yet
};

// train.init: loads `weights` into every model instance (a safetensors file,
// names as PyTorch's state_dict). Strict: every tensor fits or ConfigError
// lists each mismatch; not strict: what fits, the rest left at its fresh
// initialisation (and `skip` globs, always). Returns what it did, to print.
std::string InitFromWeights(const std::string& weights, bool strict,
                            const std::vector<std::string>& skip,
                            const std::vector<Model*>& models);

}  // namespace cnnflow
