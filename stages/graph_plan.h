// What a graph decides before any of its nodes is built, read from the
// nodes' arguments. A stage type that decides something says so through its
// plan hook (CNNFLOW_STAGE_PLAN), so the trainer and `cnnflow validate` read
// one answer instead of matching stage names and re-deriving the rule.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "ops/schema.h"

namespace cnnflow {

struct GraphPlan {
  // The sampler: samples per batch (its batch per replica x its replicas),
  // and whether the pass drops the last incomplete batch. batch_samples 0:
  // the graph has no sampler.
  int64_t batch_samples = 0;
  bool drop_last = false;
  // The prefetch stages: batches they hold at most, and the memory budget
  // that caps them (0: none).
  int64_t prefetch_depth = 0;
  double prefetch_memory_mb = 0;
};

// A stage type's plan hook: what its node with `args` (defaults filled)
// decides, added to `plan`. The node's `where` names it in errors.
using StagePlanner =
    std::function<void(const Args& args, const std::string& where, GraphPlan& plan)>;

struct StagePlanRegistration {
  // Attaches `planner` to the registered stage type `type` (registered
  // before it, in the same file).
  StagePlanRegistration(const char* type, StagePlanner planner);
};

#define CNNFLOW_STAGE_PLAN(type_name, planner) \
  static ::cnnflow::StagePlanRegistration cnnflow_stage_plan_##type_name(#type_name, planner)

}  // namespace cnnflow
