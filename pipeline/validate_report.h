// What `cnnflow validate` prints of a built run: the layers with their
// shapes, parameters and FLOPs, the tensor-parallel split and what it costs,
// the pipeline's stages, the graphs per device, and the memory known before
// the run starts (with a warning when the host has too little), on GPUs each
// GPU's predicted peak.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipeline/run_config.h"

namespace cnnflow {

class Dataset;
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

// What one GPU of graph.devices holds at the peak of a training step,
// predicted from the model's shapes and the config, with no GPU needed
// (docs/gpus.md#memory). Each figure is in the pool's blocks (its size
// classes), summed over the GPU's replicas (its lanes, each with its own
// pool): what `cnnflow train` measures as the lanes' peaks summed.
struct GpuMemoryEstimate {
  Device device;
  int replicas = 0;           // lanes: how often graph.devices lists it
  double state_mb = 0;        // f32 parameters, gradient buckets, optimizer state, BN buffers
  double copies_mb = 0;       // compute-dtype and KRSC weight copies, layers' per-channel state
  double activations_mb = 0;  // every layer's output, kept for backward and between steps
  double backward_mb = 0;     // at backward's peak: gradients in flight, scratch, the loss's
  double workspace_mb = 0;    // cuDNN's workspace (an estimate: its algorithm search's)
  double input_mb = 0;        // staged batches, or the resident set and the rows made from it
  double peak_mb = 0;         // their sum: all of it is live during backward
};
// On data-parallel GPU replicas (else empty): one per distinct GPU, in the
// order of graph.devices. `model`: the run's model, built on any device
// (only its shapes and parameters are read). `resident_bytes`: the uint8
// training set each GPU holds (data.device_resident), 0 for none.
std::vector<GpuMemoryEstimate> EstimateGpuMemory(const RunConfig& config, Model& model,
                                                 int64_t resident_bytes);
// The uint8 set data.device_resident would hold on each GPU: the training
// set at the model's input size (0 where it would stay on the host).
int64_t PredictResidentBytes(const RunConfig& config, const Dataset& train);
// "GPU fusion: ..." (what the GPUs run fused of `model`: docs/gpus.md), or
// "" off GPUs.
std::string DescribeGpuFusion(const RunConfig& config, const Model& model);
// One "GPU memory: cuda:K peak ~N MB predicted (...)" line per GPU.
std::string DescribeGpuMemory(const std::vector<GpuMemoryEstimate>& estimates);
// graph.cuda_graph: "CUDA graphs: ..." (whether the steps will be captured,
// or why not), or "" when it is off.
std::string DescribeCudaGraph(const RunConfig& config, const Model& model);
// At the end of a run: how many steps replica 0 replayed, or why none.
std::string DescribeCudaGraphRun(const RunConfig& config, const ReplicaSet* replicas);

// What a run measures: each distinct GPU's lanes' pools summed, each at its
// own peak (the lanes run side by side), in the order first listed.
struct GpuLane {
  Device device;
  int lane = 0;
};
struct GpuPoolUse {
  Device device;
  size_t peak_in_use = 0;  // bytes
  size_t held = 0;
};
std::vector<GpuPoolUse> MeasureGpuPools(const std::vector<GpuLane>& lanes);
void ResetGpuPoolPeaks(const std::vector<GpuLane>& lanes);

// `replicas` (data parallel) or `pipeline` (graph.pipeline): the one the run
// built, the other null.
std::string ValidateReport(const RunConfig& config, Model& model, ReplicaSet* replicas,
                           PipelineModel* pipeline, int64_t steps_per_epoch);

}  // namespace cnnflow
