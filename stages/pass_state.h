// One pass of a run (an epoch of training, an evaluation, or a segment of
// one between checkpoints): what it is, set when it starts, and what its
// stages fill in as it runs. Its owner makes a new one for each pass; the
// stages get it by reference beside the run's context (run_context.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ops/loss.h"
#include "stages/message.h"
#include "stages/pass_plan.h"

namespace cnnflow {

// Totals over one pass (an epoch of training or an evaluation).
struct PassMetrics {
  double loss_sum = 0;  // sum over batches of mean loss x batch size
  int64_t correct = 0;
  int64_t samples = 0;
  int64_t batches = 0;
  int64_t skipped = 0;  // bad records left out (on_bad_record: skip)
  double seconds = 0;
  // A batch (or chunk) of `rows` samples whose mean loss was `mean_loss`.
  void Add(double mean_loss, int64_t right, int64_t rows) {
    loss_sum += mean_loss * static_cast<double>(rows);
    correct += right;
    samples += rows;
  }
  // Another pass's counts (its seconds aside).
  void Merge(const PassMetrics& o) {
    loss_sum += o.loss_sum;
    correct += o.correct;
    samples += o.samples;
    batches += o.batches;
    skipped += o.skipped;
  }
  double mean_loss() const { return samples ? loss_sum / static_cast<double>(samples) : 0; }
  double accuracy() const { return samples ? static_cast<double>(correct) / samples : 0; }
  double samples_per_second() const { return seconds > 0 ? samples / seconds : 0; }
};

// A setting a stage lets the autotuner move while the graph runs (decode
// concurrency, prefetch depth), within [min, max].
struct TunableKnob {
  std::string name;  // "<node>.<param>", e.g. "load.threads"
  int64_t value = 0, min = 1, max = 1;
  bool doubling = false;                // moves by x2 and /2 (depths), else by +-1 (threads)
  std::function<int64_t(int64_t)> set;  // applies a value, returns the one in force
};

// Values the lanes of a graph hand on per batch (by BatchMessage::index),
// one slot per lane: each lane puts its own, and whoever reads them takes a
// lane's or the batch's at once. A batch's slots go once all are taken.
// Thread-safe.
template <typename T>
class LaneSlots {
 public:
  void Put(int64_t batch, int lane, int lanes, T value) {
    std::lock_guard<std::mutex> lock(mu_);
    Slots& s = slots_[batch];
    if (s.values.empty()) {
      s.values.resize(static_cast<size_t>(lanes));
      s.held.assign(static_cast<size_t>(lanes), 0);
    }
    if (!s.held[lane]) {
      s.held[lane] = 1;
      ++s.count;
    }
    s.values[lane] = std::move(value);
  }
  // Lane `lane`'s value of `batch` (default where it put none).
  T Take(int64_t batch, int lane) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(batch);
    if (it == slots_.end() || !it->second.held[lane]) return T();
    Slots& s = it->second;
    T value = std::move(s.values[lane]);
    s.held[lane] = 0;
    if (--s.count == 0) slots_.erase(it);
    return value;
  }
  // Every lane's value of `batch` (default where a lane put none).
  std::vector<T> TakeAll(int64_t batch, int lanes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto node = slots_.extract(batch);
    if (node.empty()) return std::vector<T>(static_cast<size_t>(lanes));
    return std::move(node.mapped().values);
  }

 private:
  struct Slots {
    std::vector<T> values;
    std::vector<char> held;
    int count = 0;  // lanes holding a value
  };
  std::mutex mu_;
  std::map<int64_t, Slots> slots_;
};

// A lane's part of a training batch: the loss sum and correct count of its
// rows, or (a GPU replica) the loss still on its way back.
struct LaneResult {
  double loss_sum = 0;
  int64_t correct = 0;
  std::shared_ptr<PendingLoss> pending;
};

// The lanes of a train graph (one per replica, or per pipeline stage):
// replica r's next batch may enter forward_backward only once its previous
// one has left the lane (the optimizer and what follows it are done with
// the weights); the pipeline's, once every lane is done. forward_backward
// or pipeline_stage sets `release` when built; the lanes' gather
// (stages/lanes.h) calls release[r]() as each batch of lane r arrives, and
// sums the lanes' `results`.
struct DeviceLanes {
  std::vector<std::function<void()>> release;
  LaneSlots<LaneResult> results;
};

struct PassState {
  // What the pass is.
  std::string pass = "train";  // or "eval"
  int64_t epoch = 0;
  int64_t max_batches = 0;  // the pass ends after this many batches (0: the whole set)
  int64_t start_batch = 0;  // it starts at this batch (a resumed epoch)
  int64_t stop_batch = 0;   // and stops before this one (0: at its end; a checkpoint)
  // Where the run is: optimizer steps and micro-batches done (the latter
  // key dropout). The lanes' gather moves them as steps end.
  int64_t global_step = 0, batches_done = 0;
  // Bytes of one input batch (batch x sample x 4): what a prefetch memory
  // budget is counted in.
  int64_t batch_bytes = 0;
  // Values chosen by autotuning, by knob name, that the stages start from.
  std::map<std::string, int64_t> tuned;
  // Called by the metrics stage after each batch (progress output).
  std::function<void(const BatchMessage&, PassState&)> on_batch;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  // What its stages fill in.
  PassPlan plan;        // the step accounting, made by its sampler
  int64_t sampled = 0;  // batches the sampler emitted
  PassMetrics metrics;
  // Records skipped by `on_bad_record: skip` ("key: error").
  std::mutex bad_records_mu;
  std::vector<std::string> bad_records;
  std::vector<TunableKnob> knobs;  // the knobs its stages offer
  DeviceLanes lanes;

  bool training() const { return pass == "train"; }
};

}  // namespace cnnflow
