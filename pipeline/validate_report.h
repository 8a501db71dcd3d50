// What `cnnflow validate` prints of a built run: the layers with their
// shapes, parameters and FLOPs, the tensor-parallel split and what it costs,
// the pipeline's stages, the graphs per device, and the memory known before
// the run starts (with a warning when the host has too little).
#pragma once

#include <cstdint>
#include <string>

#include "pipeline/run_config.h"

namespace cnnflow {

class Model;
class PipelineModel;
class ReplicaSet;

// The memory a run's training graph holds, known before it starts.
struct MemoryEstimate {
  double batch_mb = 0;         // one batch: train.batch rows per data-parallel replica
  int64_t prefetch_depth = 0;  // batches the prefetch stages hold at most (memory_mb caps them)
  double prefetch_mb = 0;
  double activations_mb = 0;  // one replica's, at train.batch
  double state_mb = 0;        // one replica's parameters, gradients, optimizer state
  double host_mb = 0;         // the prefetched batches and the replicas on CPUs
};
MemoryEstimate EstimateMemory(const RunConfig& config, const Model& model, int data_parallel,
                              bool pipeline);

// `replicas` (data parallel) or `pipeline` (graph.pipeline): the one the run
// built, the other null.
std::string ValidateReport(const RunConfig& config, Model& model, ReplicaSet* replicas,
                           PipelineModel* pipeline, int64_t steps_per_epoch);

}  // namespace cnnflow
