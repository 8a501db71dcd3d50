// One set of CPU convolution kernel picks for every process of a job: the
// algorithm a pass runs changes the last bits of its result, and each host
// keeps a pick file of its own (ops/cpu/conv/pick_cache.h), which another history
// or a deleted file makes differ. So rank 0 picks, for the batch sizes the
// replicas will see, and the others take its picks.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/collectives/mpi_world.h"
#include "ops/model.h"

namespace cnnflow {

// The rows a data-parallel replica trains on in a step: `replica_batch`,
// and the parts of an epoch's short last global batch (of `samples` over
// `replicas` replicas; none when it is dropped), each once.
std::vector<int64_t> ReplicaBatchSizes(int64_t samples, int64_t replica_batch, int replicas,
                                       bool drop_last);

// The rows an evaluation's forward passes take: each process's shard of
// `samples` (every `processes`-th sample) in batches of `batch`, each cut
// into micro-batches of `micro_batch` (stages/eval_step.cc), each size once.
std::vector<int64_t> EvalBatchSizes(int64_t samples, int64_t batch, int64_t micro_batch,
                                    int processes);

// Rank 0 picks the kernels of every convolution of `model` at each of
// `batch_sizes` (measuring, or from its pick file) and broadcasts its picks;
// every process adopts them. A collective: every process calls it at the
// same point, before its first forward pass. Returns how many picks went.
int ShareKernelPicks(Model& model, const std::vector<int64_t>& batch_sizes, MpiWorld& world,
                     double timeout_s);

}  // namespace cnnflow
