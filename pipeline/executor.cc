#include "pipeline/executor.h"

#include <tbb/flow_graph.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "stages/pass_state.h"
#include "stages/run_context.h"
#include "stages/stage.h"

namespace cnnflow {

namespace {

using Ports = std::map<std::string, StagePorts>;

// Joins the nodes along the spec's edges; returns each node's edge count
// out. Per-device nodes joined lane to lane go into `lanes_go_on`.
std::map<std::string, int> ConnectEdges(const GraphSpec& spec, Ports& ports,
                                        std::set<std::string>& lanes_go_on) {
  std::map<std::string, int> outgoing;
  for (const auto& [from, to] : spec.edges) {
    const StagePorts& a = ports[from];
    const StagePorts& b = ports[to];
    const bool lanes_out = !a.lane_outputs.empty(), lanes_in = !b.lane_inputs.empty();
    if (!lanes_out && a.output == nullptr) {
      throw ConfigError(StrCat(spec.file, ": node '", from, "' has no output"));
    }
    if (!lanes_in && b.input == nullptr) {
      throw ConfigError(StrCat(spec.file, ": node '", to, "' is a source and takes no input"));
    }
    // Lanes carry each batch once per replica: they join lane to lane; they
    // end in a gather, and only forward_backward starts them.
    const bool gathers = lanes_out && !lanes_in && !a.gather_inputs.empty();
    if (lanes_out != lanes_in && !gathers) {
      const std::string& laned = lanes_out ? from : to;
      throw ConfigError(StrCat(spec.file, ": edge ", from, " -> ", to, ": '", laned, "' (",
                               spec.Find(laned)->stage, ") is per-device lanes ",
                               lanes_out ? "out" : "in", ", '", lanes_out ? to : from, "' (",
                               spec.Find(lanes_out ? to : from)->stage,
                               ") is not; between forward_backward and optimizer only "
                               "per-device stages go"));
    }
    if (lanes_out && lanes_in) {
      CNNFLOW_ENFORCE(a.lane_outputs.size() == b.lane_inputs.size(), "node '", from, "' has ",
                      a.lane_outputs.size(), " lanes, node '", to, "' ", b.lane_inputs.size());
      for (size_t r = 0; r < a.lane_outputs.size(); ++r) {
        tbb::flow::make_edge(*a.lane_outputs[r], *b.lane_inputs[r]);
      }
      lanes_go_on.insert(from);
    } else {  // plain, or a gather's output (its lanes are wired in below)
      tbb::flow::make_edge(*a.output, *b.input);
    }
    ++outgoing[from];
  }
  return outgoing;
}

// Lanes that go on to no per-device node end in their node's gather (each
// lane's message lets that replica's next batch in).
void EndLanes(const GraphSpec& spec, Ports& ports, const std::set<std::string>& lanes_go_on) {
  for (const auto& n : spec.nodes) {
    const StagePorts& p = ports[n.name];
    if (p.lane_outputs.empty() || lanes_go_on.count(n.name)) continue;
    if (p.gather_inputs.empty()) {
      throw ConfigError(StrCat(spec.file, ": node '", n.name, "' (", n.stage,
                               ") ends the graph's device lanes but cannot gather them: put an "
                               "optimizer after it"));
    }
    for (size_t r = 0; r < p.lane_outputs.size(); ++r) {
      tbb::flow::make_edge(*p.lane_outputs[r], *p.gather_inputs[r]);
    }
  }
}

using ReleaseNode = tbb::flow::function_node<Message, tbb::flow::continue_msg>;

// Messages that leave the graph give their prefetch tokens back: a node
// after the one sink (null without limiters).
std::unique_ptr<ReleaseNode> ReleaseAtTheEnd(tbb::flow::graph& g, const GraphSpec& spec,
                                             Ports& ports, const std::map<std::string, int>& out,
                                             const std::vector<Stage*>& limiters) {
  if (limiters.empty()) return nullptr;
  std::vector<std::string> sinks;
  for (const auto& n : spec.nodes)
    if (!out.count(n.name)) sinks.push_back(n.name);
  if (sinks.size() != 1 || ports[sinks[0]].output == nullptr) {
    throw ConfigError(StrCat(spec.file, ": graph '", spec.name,
                             "' has a prefetch limit, so it needs exactly one sink node with an "
                             "output; it has ",
                             sinks.size()));
  }
  auto release = std::make_unique<ReleaseNode>(g, tbb::flow::serial, [limiters](const Message&) {
    for (Stage* l : limiters) l->Release();
    return tbb::flow::continue_msg();
  });
  tbb::flow::make_edge(*ports[sinks[0]].output, *release);
  return release;
}

}  // namespace

void RunGraph(const GraphSpec& spec, const RunContext& run, PassState& pass) {
  tbb::flow::graph g;  // declared first: destroyed after the nodes that use it
  std::vector<std::unique_ptr<Stage>> stages;
  // Destroyed before the stages' nodes: a graph that fails while it is
  // being built or connected may have tasks pending already (a buffer
  // spawns one when it gets a successor), which must run before the nodes
  // they point to go.
  struct DrainOnExit {
    tbb::flow::graph& g;
    ~DrainOnExit() {
      try {
        g.wait_for_all();
      } catch (...) {  // the first error is already on its way out
      }
    }
  } drain{g};
  Ports ports;
  std::vector<Stage*> limiters;
  for (const auto& n : spec.nodes) {
    const StageType* type = StageRegistry::Get().Find(n.stage);
    CNNFLOW_ENFORCE(type != nullptr, "unknown stage ", n.stage);
    try {
      stages.push_back(type->create({n.name, n.stage}, n.args));
      ports[n.name] = stages.back()->Build(g, run, pass);
    } catch (const StageError&) {
      throw;
    } catch (const std::exception& e) {
      throw StageError(StrCat(n.where, ": node '", n.name, "' (", n.stage, "): ", e.what()));
    }
    if (ports[n.name].is_limiter) limiters.push_back(stages.back().get());
  }
  std::set<std::string> lanes_go_on;  // per-device nodes joined lane to lane to the next
  const std::map<std::string, int> outgoing = ConnectEdges(spec, ports, lanes_go_on);
  EndLanes(spec, ports, lanes_go_on);
  const std::unique_ptr<ReleaseNode> release = ReleaseAtTheEnd(g, spec, ports, outgoing, limiters);

  for (auto& [name, p] : ports)
    if (p.activate) p.activate();
  g.wait_for_all();  // rethrows the first exception of a node, after cancelling the graph
}

}  // namespace cnnflow
