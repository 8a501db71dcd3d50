// Step accounting: where each batch of a pass stands in the run's optimizer
// steps. The sampler makes the plan once, when its pass starts, from the
// pass's batch count, the accumulation window and where the run is; the
// stages and the trainer ask it instead of deriving it. Batches are
// numbered within the epoch (BatchMessage::index).
#pragma once

#include <algorithm>
#include <cstdint>

#include "loaders/sampler.h"
#include "ops/error.h"

namespace cnnflow {

// The batches of a pass over `samples` samples (this process's shard),
// `batch` each, cut at max_steps when that is > 0.
inline int64_t PassBatches(int64_t samples, int64_t batch, bool drop_last, int64_t max_steps) {
  const int64_t n = ShardedSampler::NumBatches(samples, batch, drop_last);
  return max_steps > 0 ? std::min(n, max_steps) : n;
}

class PassPlan {
 public:
  PassPlan() = default;
  // `batches` in the pass, `accumulate` per optimizer step. The pass runs
  // from batch `first` (a resumed epoch skips what was trained: whole
  // windows), the run having done `global_step` optimizer steps and
  // `micro_step` batches before it.
  PassPlan(int64_t batches, int64_t accumulate, int64_t first = 0, int64_t global_step = 0,
           int64_t micro_step = 0)
      : batches_(batches),
        accumulate_(std::max<int64_t>(1, accumulate)),
        first_(std::min(first, batches)),
        global_step_(global_step),
        micro_step_(micro_step) {
    CNNFLOW_ENFORCE(first_ % accumulate_ == 0 || first_ == batches_, "a pass starts at batch ",
                    first_, ", inside an accumulation window of ", accumulate_);
  }

  int64_t batches() const { return batches_; }
  int64_t first() const { return first_; }
  // Optimizer steps in the whole pass (the last window may be short).
  int64_t steps() const { return (batches_ + accumulate_ - 1) / accumulate_; }

  // Optimizer steps and batches the run has done before batch `index`.
  int64_t GlobalStep(int64_t index) const { return global_step_ + (index - first_) / accumulate_; }
  int64_t MicroStep(int64_t index) const { return micro_step_ + (index - first_); }
  // Whether batch `index` is the last of its accumulation window (or of the
  // pass): where the gradients are reduced and the optimizer steps.
  bool EndsWindow(int64_t index) const {
    return (index + 1) % accumulate_ == 0 || index + 1 == batches_;
  }
  // The batches of `index`'s window, and whether one starts at `index`
  // (where a stop request may end the pass).
  int64_t WindowBatches(int64_t index) const {
    return std::min(accumulate_, batches_ - (index - index % accumulate_));
  }
  bool StartsWindow(int64_t index) const { return index % accumulate_ == 0; }

 private:
  int64_t batches_ = 0;
  int64_t accumulate_ = 1;
  int64_t first_ = 0;
  int64_t global_step_ = 0;
  int64_t micro_step_ = 0;
};

}  // namespace cnnflow
