// A training graph as data: nodes (a stage type and its checked parameters)
// and edges, parsed from a graph template in graphs/ with `$a.b` references
// filled from the run's config. Validated before any node is built: known
// stage types, typed parameters, edges between known nodes, no cycles.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <utility>
#include <vector>

#include "ops/schema.h"
#include "pipeline/yaml_util.h"
#include "stages/graph_plan.h"

namespace cnnflow {

struct NodeSpec {
  std::string name;
  std::string stage;
  Args args;
  std::string where;  // file:line:col, for messages
};

struct GraphSpec {
  std::string name;  // "train", "eval"
  std::string file;
  std::vector<NodeSpec> nodes;                             // in file order
  std::vector<std::pair<std::string, std::string>> edges;  // from -> to
  const NodeSpec* Find(const std::string& node) const;     // nullptr: no such node
  NodeSpec* Find(const std::string& node);
  // Nodes in an order where every edge goes forward (checked acyclic).
  std::vector<std::string> TopologicalOrder() const;

  // The graph as it runs on `devices` (graph.devices): a per-device stage
  // (forward_backward, allreduce, optimizer) becomes one node per device,
  // "devices[cpu:1]"; lane to lane between per-device nodes, fanned out
  // and in at their ends. The nodes of a chained stage (pipeline_stage)
  // also message their neighbours: edges labelled "activations" (device d
  // to d+1) and "gradients" (back).
  struct Expanded {
    struct Node {
      std::string name, stage, device;  // device: "" for a node of the whole graph
      const NodeSpec* spec;
    };
    struct Edge {
      int from, to;
      std::string label;  // "" for the batch itself
    };
    std::vector<Node> nodes;  // in topological order
    std::vector<Edge> edges;
  };
  Expanded Expand(const std::vector<std::string>& devices) const;
  // "  node (stage, param=value, ...) -> next, ..." lines of Expand(devices).
  std::string ToString(const std::vector<std::string>& devices = {}) const;
  // Graphviz: this graph as a cluster (subgraph) named after it.
  std::string ToDot(const std::vector<std::string>& devices) const;
  // What the graph decides before it is built: each node's stage type's
  // plan hook on the node's arguments (stages/graph_plan.h).
  GraphPlan Plan() const;
};

// Parses graph `name` of a template. `run` resolves `$path` values (a
// dotted path into the run's config tree); `run_doc` names where it is.
GraphSpec ParseGraph(const YamlDoc& tmpl, const std::string& name, const YAML::Node& run,
                     const YamlDoc& run_doc);

}  // namespace cnnflow
