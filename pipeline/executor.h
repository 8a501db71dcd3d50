// The executor: turns a GraphSpec into a oneTBB flow graph over a run's
// context and one pass's state, and runs it until its sources are exhausted. An exception in any
// node cancels the graph and surfaces here as a StageError naming the node.
#pragma once

#include "pipeline/graph_spec.h"

namespace cnnflow {

struct RunContext;
struct PassState;

// Builds and runs `spec` once (one pass: an epoch of training, or an
// evaluation). Returns when every message has left the graph.
void RunGraph(const GraphSpec& spec, const RunContext& run, PassState& pass);

}  // namespace cnnflow
