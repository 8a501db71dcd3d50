// What a graph decides before any of its nodes is built, read from the
// nodes' arguments. A stage type that decides something says so through its
// plan hook (CNNFLOW_STAGE_PLAN), so the trainer and `cnnflow validate` read
// one answer instead of matching stage names and re-deriving the rule.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ops/registry.h"
#include "ops/schema.h"

namespace cnnflow {

struct GraphPlan {
  // The sampler: samples per batch (its batch per replica x its replicas),
  // and whether the pass drops the last incomplete batch. batch_samples 0:
  // the graph has no sampler.
  int64_t batch_samples = 0;
  int64_t replica_batch = 0;  // its batch per replica
  bool drop_last = false;
  // The prefetch stages: batches they hold at most, and the memory budget
  // that caps them (0: none).
  int64_t prefetch_depth = 0;
  double prefetch_memory_mb = 0;

  // The loader's settings, which `cnnflow tune` varies: the node arguments
  // that set decode threads, and prefetch depth.
  struct NodeArg {
    std::string node, arg;
  };
  std::vector<NodeArg> load_threads_args, prefetch_depth_args;
  // The nodes that train (forward and backward, gradient reduction, the
  // optimizer step, the weight average): `cnnflow tune` cuts them out to time
  // the loader alone.
  std::set<std::string> training_nodes;
  // Nodes that admit a device's next batch only when an optimizer node after
  // them is done with its last one (so the graph needs one after them), and
  // the optimizer nodes.
  std::vector<std::string> waits_for_optimizer;
  std::set<std::string> optimizer_nodes;
  // The weight average of the replicas' weights (an ema node).
  struct WeightAveragePlan {
    std::string node, where;
    double decay = 0;
    bool warmup = false;
    bool eval = false;  // evaluate on the average
    // The schedule, in epochs where the trainer turns them into steps.
    int64_t every = 1;
    double start_epoch = 0;
    double ramp_power = 0;
    bool lookahead = false;  // copy each update back into the weights
  };
  std::optional<WeightAveragePlan> weight_average;
};

// The node a plan hook is called for: its name, and where it is written
// (the template's file and line, for errors).
struct PlanNode {
  std::string name, where;
};

// A stage type's plan hook: what its node with `args` (defaults filled)
// decides, added to `plan`.
using StagePlanner = std::function<void(const Args& args, const PlanNode& node, GraphPlan& plan)>;

// A stage type's plan hook, registered under the stage type's name.
struct StagePlan {
  static constexpr const char* kKind = "stage plan";
  StagePlanner plan;
};

// Variadic: the planner lambda may hold commas outside parentheses.
#define CNNFLOW_STAGE_PLAN(type_name, ...)                                                      \
  static ::cnnflow::RegisterIn<::cnnflow::StagePlan> cnnflow_stage_plan_##type_name(#type_name, \
                                                                                    {__VA_ARGS__})

}  // namespace cnnflow
