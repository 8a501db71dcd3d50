// The message that flows through a training graph: one batch, from the
// sampler's indices to the step's results. Messages are shared handles; the
// batch tensor comes from the memory pool, so nothing large is copied.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ops/tensor.h"

namespace cnnflow {

struct BatchMessage {
  // Set by the sampler.
  int64_t epoch = 0;
  int64_t index = 0;                // batch number within the epoch
  int64_t sequence = 0;             // position in this run of the graph: the sequencing key
  int64_t global_step = 0;          // optimizer steps before this batch, over all epochs
  int64_t micro_step = 0;           // batches before this one, over all epochs
  std::vector<int64_t> sample_ids;  // the loader drops those of bad records
  // Training: the rows of this step's global batch over all processes, as
  // sampled; this process holds its part RunContext::ProcessRows(global_rows).
  // 0 (an evaluation, a padded sampler): each
  // process's rows x processes.
  int64_t global_rows = 0;
  // Set by the loader.
  Tensor inputs;  // [N, C, H, W] or [N, C, L]
  // data.device_resident: the loader read only the labels; each GPU
  // replica makes its rows on its GPU (RunContext::resident), and `inputs`
  // is empty.
  bool rows_on_device = false;
  std::vector<int64_t> labels;
  // Set by mixup: row i's target is mix_weights[i] of labels[i] and the rest
  // of mix_labels[i] (empty: the labels alone).
  std::vector<int64_t> mix_labels;
  std::vector<float> mix_weights;
  // Set by the step.
  double loss = 0;  // mean over the batch
  int64_t correct = 0;
  double lr = 0;
  bool dropped = false;  // not trained: every process agreed to stop before it
  // Set by the lanes' gather for CPU replicas: replica 0's busy seconds
  // (compute and waiting for reductions) over the run so far, as it
  // finished this batch; what is left of the wall time the step waited for
  // data. Negative: not measured (GPU replicas, pipelines).
  double step_busy_seconds = -1;
  double step_reduce_wait_seconds = -1;  // of those, waiting for reductions
};

using Message = std::shared_ptr<BatchMessage>;

}  // namespace cnnflow
