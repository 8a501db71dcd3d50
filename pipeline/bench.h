// `cnnflow bench`: data-parallel scaling of a config. For each device count
// (CPU replicas in this process; under mpirun, in every process), after a
// warm-up, times a fixed number of training steps at a fixed per-replica
// batch and reports images/s, speedup and efficiency against the first
// count, and where the step's time went: waiting for gradient reductions
// after backward (the all-reduce that backward could not hide), and waiting
// for data (the step idle between batches).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cnnflow {

struct BenchRow {
  int devices = 1;  // replicas per process
  int processes = 1;
  int64_t steps = 0;
  int64_t batch = 0;  // global batch per step
  double images_per_s = 0;
  double speedup = 1, efficiency = 1;
  double allreduce_share = 0;  // of wall time, replica 0
  double data_wait_share = 0;  // of wall time, replica 0
  // graph.cuda_graph on GPUs: how many timed steps replica 0 replayed, or
  // why none (BenchTable prints it under the table); "" otherwise.
  std::string note;
};

struct BenchOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::vector<int> devices = {1, 2};
  int64_t steps = 100;
  int64_t warmup = 10;
};

// Runs the benchmark (collective under MPI: every process calls it).
std::vector<BenchRow> RunScalingBench(const BenchOptions& options);

// A pipeline config (graph.pipeline) against the same model on one device
// with the whole thread budget: images/s of both, and each stage's measured
// idle share next to the schedule's theoretical bubble.
struct PipelineBench {
  std::string single_device;  // where the unsplit model ran
  double single_images_per_s = 0, pipeline_images_per_s = 0;
  std::vector<double> bubble;  // measured, per stage
  double theoretical_bubble = 0;
  int stages = 0, microbatches = 0;
  std::string schedule;
  std::string ToString() const;
};
PipelineBench RunPipelineBench(const BenchOptions& options);
std::string BenchTable(const std::vector<BenchRow>& rows);
std::string BenchCsv(const std::vector<BenchRow>& rows);

}  // namespace cnnflow
