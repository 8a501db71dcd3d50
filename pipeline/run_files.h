// The run folder's logs, one writer for all of them (process 0 of a run):
//   config.yaml            the resolved config (a fresh run)
//   metrics.csv            one row per epoch
//   steps.csv              a row every train.log_every steps (the train/*
//                          scalars) and one at each epoch's last step with
//                          its test loss and accuracy (cnnflow plot)
//   events.out.tfevents.*  TensorBoard scalars: train/* every log_every
//                          steps, epoch/* per epoch, and ranks/* per
//                          epoch with several ranks (pipeline/rank_times.h)
//   autotune.csv           the autotuner's moves (graph.autotune)
// Checkpoints and model.safetensors are written elsewhere
// (pipeline/checkpoint_control.h). A write that fails (a full disk) throws
// Error naming the file, and leaves each file ending with its last whole row.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/autotune.h"
#include "pipeline/rank_times.h"
#include "stages/pass_state.h"

namespace cnnflow {

class AppendFile;
class TfEventWriter;

// One finished epoch, as the logs record it.
struct EpochRecord {
  int64_t epoch = 0;        // 1-based
  int64_t global_step = 0;  // optimizer steps at its end
  PassMetrics train;
  std::optional<PassMetrics> test;  // none: the run has no test set
  double lr = 0;
  // Shares of the epoch's training wall time; negative: not measured.
  double data_wait_share = -1, allreduce_share = -1;
  // Several ranks: the spread of their step phases (ranks/* scalars).
  std::optional<RankSpread> ranks;
};

class RunFiles {
 public:
  // The metrics.csv columns, as checkpoints store its rows.
  static const std::vector<std::string>& MetricsColumns();

  // Opens the logs in `dir` (created if missing). A fresh run writes
  // `config_text` as config.yaml and starts each log with its header. A run
  // resumed at `resumed_step` rewrites metrics.csv from `metrics_rows` (the
  // checkpoint's) in one step, and drops the steps.csv rows after
  // resumed_step, which a run that died later had written and this one writes
  // again. `window` is the checkpoint's train/* window (WindowState), or "".
  RunFiles(const std::string& dir, const std::string& config_text, bool autotune,
           std::optional<int64_t> resumed_step, std::vector<std::vector<double>> metrics_rows,
           const std::string& window);
  ~RunFiles();

  // The train/* scalars average over a window: the batches since the last
  // ones (or the epoch's start), summed batch by batch, so that where the
  // epoch was cut into segments (checkpoints, a stop and a resume) changes no
  // bit of them. Seconds: those of finished segments plus the current
  // segment's pass seconds since the last scalars.
  //
  // Starts an epoch's window, unless the run resumed into the middle of this
  // epoch (the restored window goes on). `busy`, `reduce_wait`: replica 0's
  // counters now (negative busy: not measured).
  void StartEpoch(double busy, double reduce_wait);
  void StartSegment();                      // a train pass starts (its seconds at 0)
  void EndSegment(double segment_seconds);  // and ends
  void AddBatch(double loss, int64_t correct, int64_t samples);
  // Writes the window's train/* scalars at `step` (TensorBoard and
  // steps.csv), then starts the next window. `busy`, `reduce_wait`: replica
  // 0's counters at the batch; `segment_seconds`: the pass's seconds so far.
  void StepScalars(int64_t step, int64_t epoch, double lr, double busy, double reduce_wait,
                   double segment_seconds);
  // The window's sums, as a checkpoint carries them.
  std::string WindowState() const;

  // A finished epoch: a metrics.csv row, its epoch/* scalars, and a
  // steps.csv row with the test loss and accuracy.
  void Epoch(const EpochRecord& r);
  void Autotune(const AutotuneDecision& d);

  const std::vector<std::vector<double>>& metrics_rows() const { return metrics_rows_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::vector<double>> metrics_rows_;
  std::unique_ptr<AppendFile> metrics_;
  std::unique_ptr<AppendFile> steps_;
  std::unique_ptr<AppendFile> autotune_;  // graph.autotune only
  std::unique_ptr<TfEventWriter> events_;
  struct Window {
    double loss_sum = 0, seconds = 0, mark = 0, busy = -1, reduce_wait = 0;
    int64_t correct = 0, samples = 0;
  } window_;
  bool window_restored_ = false;  // the resumed epoch's window goes on
};

}  // namespace cnnflow
