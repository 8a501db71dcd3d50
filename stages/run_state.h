// What the stages of a run share: data, model, optimizer, schedule, the
// epoch's counters and the hooks for progress output. The trainer
// (pipeline/) owns it; stages read and update it from their node bodies.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "loaders/dataset.h"
#include "loaders/transform.h"
#include "ops/model.h"
#include "ops/parallel/data_parallel.h"
#include "ops/parallel/pipeline_model.h"
#include "ops/train/lr_schedule.h"
#include "ops/train/weight_average.h"
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

// The lanes of a train graph (one per replica, or per pipeline stage):
// replica r's next batch may enter forward_backward only once its previous
// one has left the lane (the optimizer and what follows it are done with
// the weights); the pipeline's, once every lane is done. forward_backward
// or pipeline_stage sets `release` when built; the lanes' gather
// (stages/lanes.h) calls release[r]() as each batch of lane r arrives.
struct DeviceLanes {
  std::vector<std::function<void()>> release;
};

struct RunState {
  // Data, by name ("train", "test"), and the per-sample transform.
  std::map<std::string, std::shared_ptr<const Dataset>> datasets;
  SampleTransform transform;
  // The model and how it learns: the replicas (each with its optimizer),
  // and replica 0's model, which evaluation and checkpoints use.
  ReplicaSet* replicas = nullptr;
  PipelineModel* pipeline = nullptr;  // instead of replicas, with graph.pipeline
  Model* model = nullptr;
  // The weight average of an `ema` node in the train graph (the trainer's).
  WeightAverage* ema = nullptr;
  const LrSchedule* schedule = nullptr;
  int64_t accumulate = 1;  // micro-batches per optimizer step
  double label_smoothing = 0;
  uint64_t seed = 0;
  int64_t threads = 1;  // the run's CPU budget

  // Where the run is. The pass's sampler reads these.
  int64_t epoch = 0;
  int64_t global_step = 0;   // optimizer steps done so far
  int64_t batches_done = 0;  // micro-batches trained so far (keys dropout)
  // This process in an MPI job, and its data shard: the processes of a
  // tensor-parallel group that spans processes read the same one (its
  // first process counts it in the metrics). Without such groups the
  // shards are the processes.
  int process_rank = 0, process_count = 1;
  int data_rank = 0, data_ranks = 1;
  // This process's data-parallel replicas among the run's
  // (graph.logical_replicas): [replica_first, replica_first +
  // replica_count) of replicas_total, in the order of a global batch's
  // rows (without logical replicas: data_rank x R of data_ranks x R).
  int replica_first = 0, replica_count = 1, replicas_total = 1;
  // This process's part [b, e) of a global batch of `rows`: its replicas'.
  std::pair<int64_t, int64_t> ProcessRows(int64_t rows) const {
    return {rows * replica_first / replicas_total,
            rows * (replica_first + replica_count) / replicas_total};
  }
  bool counts_metrics() const { return process_rank % (process_count / data_ranks) == 0; }
  double collective_timeout_s = 300;
  int64_t max_steps = 0;       // stop a training pass after this many batches (0: whole epoch)
  int64_t eval_max_steps = 0;  // and an evaluation pass (0: the whole set)
  int64_t start_batch = 0;     // the pass starts at this batch (a resumed epoch)
  int64_t stop_batch = 0;      // and stops before this one (0: at its end)
  std::atomic<bool> stop_requested{false};
  // In an MPI job: the last step every process trains once they agreed to
  // stop (batches already sampled beyond it are dropped); -1: none.
  std::atomic<int64_t> stop_after_step{-1};

  // The pass being run (reset by the trainer before each graph run).
  std::string pass;     // "train" or "eval"
  PassPlan plan;        // its step accounting, made by its sampler
  int64_t sampled = 0;  // batches the sampler emitted in this run of the graph
  PassMetrics metrics;
  std::chrono::steady_clock::time_point pass_start;
  // Records skipped by `on_bad_record: skip` in this pass ("key: error").
  std::mutex bad_records_mu;
  std::vector<std::string> bad_records;
  // Bytes of one input batch of this pass (batch x sample x 4): what a
  // prefetch memory budget is counted in.
  int64_t batch_bytes = 0;
  // Knobs the stages of the running graph offer (reset before each pass),
  // and values chosen by autotuning, by knob name, that stages built later
  // start from.
  std::vector<TunableKnob> knobs;
  std::map<std::string, int64_t> tuned;
  // Called by the metrics stage after each batch (progress output).
  std::function<void(const BatchMessage&, const PassMetrics&)> on_batch;

  // CPU time the loader's decode tasks used, on their threads' own clocks
  // (so a worker spinning for work counts nowhere): `tune`'s loader cores.
  std::atomic<int64_t> loader_cpu_ns{0};

  // Accounting used by tests and reports: batches between the prefetch
  // limiter and the end of the graph, now and at most.
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> max_in_flight{0};

  DeviceLanes lanes;

  const Dataset& dataset(const std::string& name) const;
};

// Replica r's rows [b, e) of a batch of `rows` split over n replicas.
inline std::pair<int64_t, int64_t> ShardRows(int64_t rows, int r, int n) {
  return ShardedSampler::Part(rows, r, n);
}

// Replica r's rows [b, e) of this process's training batch m: the rows its
// global data-parallel replica (replica_first + its replica) takes of
// the global batch, as one process with every replica would cut it
// (ShardRows), so uneven parts of a short last batch split alike whatever
// the layout. The members of a tensor-parallel group share theirs. Where
// the loader skipped bad records here, the rows left are cut among this
// process's replicas.
inline std::pair<int64_t, int64_t> ReplicaRows(const RunState& s, const BatchMessage& m, int r) {
  const ReplicaSet& set = *s.replicas;
  const auto rows = static_cast<int64_t>(m.labels.size());
  const int n = set.data_parallel();
  const auto [pb, pe] = s.ProcessRows(m.global_rows);
  if (pe - pb != rows) return ShardRows(rows, set.data_replica(r), n);
  const auto [b, e] =
      ShardRows(m.global_rows, s.replica_first + set.data_replica(r), s.replicas_total);
  return {b - pb, e - pb};
}

// The rows a training step's gradient is the mean over: the global batch's,
// less the bad records skipped here (those skipped elsewhere are not known
// here; unset: this process's rows x processes).
inline int64_t GlobalRows(const RunState& s, const BatchMessage& m) {
  const auto rows = static_cast<int64_t>(m.labels.size());
  if (m.global_rows <= 0) return rows * s.data_ranks;
  const auto [pb, pe] = s.ProcessRows(m.global_rows);
  return m.global_rows - (pe - pb - rows);
}

}  // namespace cnnflow
