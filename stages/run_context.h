// What a run gives its stages: the run's context (data, model, optimizer
// schedule, this process's place in the job), set once by its owner (the
// trainer, or a loader) and read by the stages, and its control (the
// atomics that stop it and count it), moved from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "loaders/dataset.h"
#include "loaders/sampler.h"
#include "loaders/transform.h"
#include "ops/model.h"
#include "ops/parallel/data_parallel.h"
#include "ops/parallel/pipeline_model.h"
#include "ops/train/lr_schedule.h"
#include "ops/train/weight_average.h"
#include "stages/message.h"
#include "stages/resident_data.h"

namespace cnnflow {

// What stops a run and what it counts as it goes, from any thread.
struct RunControl {
  std::atomic<bool> stop_requested{false};
  // In an MPI job: the last step every process trains once they agreed to
  // stop (batches already sampled beyond it are dropped); -1: none.
  std::atomic<int64_t> stop_after_step{-1};
  // CPU time the loader's decode tasks used, on their threads' own clocks
  // (so a worker spinning for work counts nowhere): `tune`'s loader cores.
  std::atomic<int64_t> loader_cpu_ns{0};
  // Batches between the prefetch limiter and the end of the graph, now and
  // at most (reports and tests).
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> max_in_flight{0};
};

struct RunContext {
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
  RunControl* control = nullptr;
  // data.device_resident: the training set on the GPU replicas' devices
  // (null: every batch is loaded on the host).
  std::shared_ptr<const ResidentData> resident;
  bool resident_rows_to_host = false;  // also copy the rows back (--dump-batches)

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
  double collective_timeout_s = 300;

  // This process's part [b, e) of a global batch of `rows`: its replicas'.
  std::pair<int64_t, int64_t> ProcessRows(int64_t rows) const {
    return {rows * replica_first / replicas_total,
            rows * (replica_first + replica_count) / replicas_total};
  }
  bool counts_metrics() const { return process_rank % (process_count / data_ranks) == 0; }
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
inline std::pair<int64_t, int64_t> ReplicaRows(const RunContext& run, const BatchMessage& m,
                                               int r) {
  const ReplicaSet& set = *run.replicas;
  const auto rows = static_cast<int64_t>(m.labels.size());
  const int n = set.data_parallel();
  const auto [pb, pe] = run.ProcessRows(m.global_rows);
  if (pe - pb != rows) return ShardRows(rows, set.data_replica(r), n);
  const auto [b, e] =
      ShardRows(m.global_rows, run.replica_first + set.data_replica(r), run.replicas_total);
  return {b - pb, e - pb};
}

// The rows a training step's gradient is the mean over: the global batch's,
// less the bad records skipped here (those skipped elsewhere are not known
// here; unset: this process's rows x processes).
inline int64_t GlobalRows(const RunContext& run, const BatchMessage& m) {
  const auto rows = static_cast<int64_t>(m.labels.size());
  if (m.global_rows <= 0) return rows * run.data_ranks;
  const auto [pb, pe] = run.ProcessRows(m.global_rows);
  return m.global_rows - (pe - pb - rows);
}

}  // namespace cnnflow
