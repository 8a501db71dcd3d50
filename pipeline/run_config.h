// A run's configuration: the YAML of configs/*.yaml (plus --set overrides)
// checked section by section against schemas, with the graph template it
// names parsed into GraphSpecs. Everything wrong is reported here, with
// file:line:col, before any data is read.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ops/device.h"
#include "ops/model.h"
#include "ops/parallel/data_parallel.h"
#include "ops/parallel/pipeline_model.h"
#include "ops/parallel/tensor_parallel.h"
#include "ops/train/optimizer.h"
#include "pipeline/graph_spec.h"
#include "pipeline/yaml_util.h"

namespace cnnflow {

// graph.startup_timeout_s when unset: the longer of this and
// graph.collective_timeout_s. Ten minutes, torch.distributed's default for
// NCCL process groups: time for a rank to read its data from a slow file
// system and build its primitives before the first step's collectives.
inline constexpr double kMinStartupTimeoutS = 600;

struct DataSpec {
  std::string source;  // a registered source type ("idx")
  Args args;
};

struct RunConfig {
  YamlDoc doc;  // the config as given, overrides applied
  std::vector<std::string> overrides;

  std::string name;
  uint64_t seed = 0;
  int threads = 0;  // the run's whole CPU budget; 0: every core

  std::map<std::string, DataSpec> data;  // "train", "test"
  std::vector<double> normalize_mean, normalize_std;
  // data.device_resident: on GPUs, the training set decoded once, held on
  // each GPU and its batches made there (where it fits); a no-op on CPUs.
  bool device_resident = false;

  Shape input_shape;
  std::vector<LayerSpec> layers;
  InitScheme init = InitScheme::kPytorchDefault;
  double label_smoothing = 0;

  double epochs = 1;   // a fraction trains the first part of the last epoch
  int64_t batch = 64;  // per replica
  int64_t eval_batch = 1000;
  int64_t eval_every = 1;        // epochs between evaluations (the last epoch always)
  int64_t max_steps = 0;         // per training pass; 0: whole epochs
  int64_t eval_max_steps = 0;    // per evaluation pass; 0: the whole test set
  int64_t accumulate = 1;        // batches per optimizer step
  int64_t checkpoint_every = 0;  // optimizer steps; 0: at epoch ends
  int64_t keep_checkpoints = 3;
  int64_t log_every = 50;  // optimizer steps between TensorBoard scalars; 0: per epoch only
  // train.init: start from these weights (PyTorch state_dict names) instead
  // of a fresh initialisation; strict: every tensor must match; skip: globs
  // of tensors left at their fresh initialisation (a new head).
  struct InitFrom {
    std::string weights;  // empty: no init
    bool strict = true;
    std::vector<std::string> skip;
  } init_from;
  // train.freeze: globs over tensor names frozen from the first step (also
  // in each LayerSpec, which applies them; train.frozen_bn there too).
  std::vector<std::string> freeze;
  OptimizerSpec optimizer;  // train.optimizer and train.param_groups
  Args schedule_args;

  std::string graph_template;  // resolved path
  // This process's data-parallel replicas, one device each (graph.devices,
  // taken in turn when this process carries more logical replicas than
  // it lists).
  std::vector<Device> devices;
  // graph.logical_replicas: the run's data-parallel replicas over every
  // process (G), and this process's share of them, leaves
  // [logical_first, logical_first + devices.size()) of the one reduction
  // tree (ops/collectives/reduction_tree.h). 0: unset, G is the devices x
  // processes of the layout.
  int logical_replicas = 0;
  int logical_first = 0;
  GraphSpec train_graph;
  GraphSpec eval_graph;
  bool autotune = false;  // graph.autotune
  // Data parallelism (graph.*): what the section's parser fills of the
  // replicas' options (ops/parallel/data_parallel.h: bucket_mb,
  // broadcast_buffers, sync_bn, tf32 and deterministic as `gpu_math`,
  // precision as `compute`, channels_last as
  // `memory_format`, flush_denormals, collective_timeout_s as `timeout_s`,
  // tensor_parallel's size and split layers); the trainer adds the layout
  // (replicas, their devices and threads).
  DataParallelOptions data_parallel;
  // graph.startup_timeout_s: the deadline of the start-up's collectives,
  // up to the end of the first training step (MpiWorld::BeginStartup).
  double startup_timeout_s = kMinStartupTimeoutS;
  double stall_warn_s = 10;  // graph.stall_warn_s: warn of a collective waiting this long
  // Pipeline model parallelism (graph.pipeline): one stage per device;
  // empty stages with pipeline on: cut automatically by FLOPs. The
  // trainer adds the threads per stage.
  bool pipeline = false;
  PipelineOptions pipeline_options;

  std::string output_dir;
};

// Loads and checks `path` with `overrides` ("train.epochs=1") applied.
RunConfig LoadRunConfig(const std::string& path, const std::vector<std::string>& overrides = {});

// The data section of `doc` alone (root "data": train, test, transform,
// on_bad_record), checked and with the messages LoadRunConfig gives: fills
// c.data and c.normalize_*, returns the section's arguments. cnnflow.Loader
// reads a data set's spec given without a config through it.
Args ReadDataSection(const YamlDoc& doc, RunConfig& c);

// The config's schemas, for `cnnflow stages` and for tests.
const Schema& TopLevelSchema();
const Schema& TrainSchema();
const Schema& ModelSchema();
const Schema& GraphSectionSchema();

// Finds a file named in a config (a graph template): as given, then
// relative to the config's folder and its parent, then to the source tree.
std::string ResolveProjectPath(const std::string& path, const std::string& config_path);

}  // namespace cnnflow
