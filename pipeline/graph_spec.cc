#include "pipeline/graph_spec.h"

#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "stages/stage.h"

namespace cnnflow {

const NodeSpec* GraphSpec::Find(const std::string& node) const {
  for (const auto& n : nodes)
    if (n.name == node) return &n;
  return nullptr;
}

NodeSpec* GraphSpec::Find(const std::string& node) {
  return const_cast<NodeSpec*>(std::as_const(*this).Find(node));
}

std::vector<std::string> GraphSpec::TopologicalOrder() const {
  std::map<std::string, int> indegree;
  for (const auto& n : nodes) indegree[n.name] = 0;
  for (const auto& [a, b] : edges) ++indegree[b];
  std::vector<std::string> order;
  std::vector<std::string> ready;
  for (const auto& n : nodes)
    if (indegree[n.name] == 0) ready.push_back(n.name);
  while (!ready.empty()) {
    std::string n = ready.front();
    ready.erase(ready.begin());
    order.push_back(n);
    for (const auto& [a, b] : edges)
      if (a == n && --indegree[b] == 0) ready.push_back(b);
  }
  if (order.size() != nodes.size()) {
    throw ConfigError(StrCat(file, ": graph '", name, "' has a cycle"));
  }
  return order;
}

GraphSpec::Expanded GraphSpec::Expand(const std::vector<std::string>& devices) const {
  Expanded x;
  std::map<std::string, std::vector<int>> ids;  // a spec node's expanded nodes
  for (const auto& n : TopologicalOrder()) {
    const NodeSpec* s = Find(n);
    const StageType* type = StageRegistry::Get().Find(s->stage);
    if (type != nullptr && type->per_device() && !devices.empty()) {
      for (const std::string& d : devices) {
        ids[n].push_back(static_cast<int>(x.nodes.size()));
        x.nodes.push_back({StrCat(n, "[", d, "]"), s->stage, d, s});
      }
      if (type->layout == StageLayout::kPerDeviceChain) {
        const std::vector<int>& at = ids[n];
        for (size_t r = 0; r + 1 < at.size(); ++r) {
          x.edges.push_back({at[r], at[r + 1], "activations"});
          x.edges.push_back({at[r + 1], at[r], "gradients"});
        }
      }
    } else {
      ids[n].push_back(static_cast<int>(x.nodes.size()));
      x.nodes.push_back({n, s->stage, "", s});
    }
  }
  for (const auto& [a, b] : edges) {
    const std::vector<int>& from = ids[a];
    const std::vector<int>& to = ids[b];
    if (from.size() > 1 && to.size() > 1) {
      for (size_t r = 0; r < from.size(); ++r) x.edges.push_back({from[r], to[r], ""});
    } else {
      for (int f : from)
        for (int t : to) x.edges.push_back({f, t, ""});
    }
  }
  return x;
}

std::string GraphSpec::ToString(const std::vector<std::string>& devices) const {
  const Expanded x = Expand(devices);
  std::ostringstream os;
  for (size_t i = 0; i < x.nodes.size(); ++i) {
    const Expanded::Node& n = x.nodes[i];
    os << "  " << n.name << " (" << n.stage;
    for (const auto& [k, v] : n.spec->args.values())
      os << ", " << k << "=" << ParamValueToString(v);
    os << ")";
    std::string outs;
    for (const auto& e : x.edges) {
      if (e.from != static_cast<int>(i)) continue;
      outs += StrCat(outs.empty() ? "" : ", ", x.nodes[e.to].name,
                     e.label.empty() ? "" : StrCat(" (", e.label, ")"));
    }
    if (!outs.empty()) os << " -> " << outs;
    os << "\n";
  }
  return os.str();
}

std::string GraphSpec::ToDot(const std::vector<std::string>& devices) const {
  const Expanded x = Expand(devices);
  auto id = [&](int i) { return StrCat("\"", name, ".", x.nodes[i].name, "\""); };
  std::ostringstream os;
  os << "  subgraph \"cluster_" << name << "\" {\n    label=\"" << name << " (" << file << ")\";\n";
  for (size_t i = 0; i < x.nodes.size(); ++i) {
    const Expanded::Node& n = x.nodes[i];
    // Per-device nodes: the spec's name, the stage and the device, shaded.
    os << "    " << id(static_cast<int>(i)) << " [label=\"" << n.spec->name << "\\n"
       << n.stage
       << (n.device.empty() ? "\"]"
                            : StrCat("\\n", n.device, "\", style=filled, fillcolor=\"#dde8f5\"]"))
       << ";\n";
  }
  for (const auto& e : x.edges) {
    os << "    " << id(e.from) << " -> " << id(e.to)
       << (e.label.empty() ? "" : StrCat(" [label=\"", e.label, "\", style=dashed]")) << ";\n";
  }
  os << "  }\n";
  return os.str();
}

namespace {

// Looks up a dotted path in the run's config ("train.batch").
YAML::Node Lookup(const YAML::Node& root, const std::string& path) {
  YAML::Node cur = root;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '.');) {
    if (!cur.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    YAML::Node next = cur[part];
    if (!next.IsDefined()) return next;
    cur.reset(next);
  }
  return cur;
}

// Replaces `$path` scalars in a node's parameter map by the run's values.
YAML::Node Substitute(const YamlDoc& tmpl, const YAML::Node& params, const YAML::Node& run,
                      const YamlDoc& run_doc, const std::string& context) {
  YAML::Node out(YAML::NodeType::Map);
  for (const auto& kv : params) {
    const std::string key = tmpl.Name(kv.first, context);
    if (key == "stage") continue;
    YAML::Node v = kv.second;
    if (v.IsScalar() && !v.Scalar().empty() && v.Scalar()[0] == '$') {
      const std::string path = v.Scalar().substr(1);
      YAML::Node found = Lookup(run, path);
      if (!found.IsDefined() || found.IsNull()) {
        tmpl.Fail(v, context, StrCat("'$", path, "' is not set in ", run_doc.path()));
      }
      out[key] = found;
    } else {
      out[key] = v;
    }
  }
  return out;
}

void ParseEdges(const YamlDoc& tmpl, const YAML::Node& edges, GraphSpec& g) {
  if (!edges.IsSequence()) tmpl.Fail(edges, "graph '" + g.name + "'", "edges: expected a list");
  std::vector<std::string> names;
  for (const auto& n : g.nodes) names.push_back(n.name);
  for (const auto& e : edges) {
    // "a -> b -> c" is a chain of edges.
    std::string text = tmpl.Name(e, "graph '" + g.name + "' edges");
    std::vector<std::string> chain;
    size_t pos = 0;
    while (true) {
      size_t arrow = text.find("->", pos);
      std::string part =
          text.substr(pos, arrow == std::string::npos ? std::string::npos : arrow - pos);
      part.erase(0, part.find_first_not_of(" \t"));
      part.erase(part.find_last_not_of(" \t") + 1);
      if (g.Find(part) == nullptr) {
        tmpl.Fail(e, "graph '" + g.name + "' edges", UnknownNameMessage("node", part, names));
      }
      chain.push_back(part);
      if (arrow == std::string::npos) break;
      pos = arrow + 2;
    }
    if (chain.size() < 2) tmpl.Fail(e, "graph '" + g.name + "' edges", "expected 'a -> b'");
    for (size_t i = 0; i + 1 < chain.size(); ++i) g.edges.emplace_back(chain[i], chain[i + 1]);
  }
}

}  // namespace

GraphSpec ParseGraph(const YamlDoc& tmpl, const std::string& name, const YAML::Node& run,
                     const YamlDoc& run_doc) {
  GraphSpec g;
  g.name = name;
  g.file = tmpl.path();
  const YAML::Node root = tmpl.root();
  const YAML::Node graph = root[name];
  if (!graph.IsDefined() || !graph.IsMap()) {
    std::vector<std::string> have;
    for (const auto& kv : root) have.push_back(tmpl.Name(kv.first, ""));
    tmpl.Fail(root, "", UnknownNameMessage("graph", name, have));
  }
  for (const auto& kv : graph) {
    const std::string key = tmpl.Name(kv.first, "graph '" + name + "'");
    if (key != "nodes" && key != "edges") {
      tmpl.Fail(kv.first, "graph '" + name + "'",
                UnknownNameMessage("key", key, {"edges", "nodes"}));
    }
  }
  const YAML::Node nodes = graph["nodes"];
  // A missing key of a const node is a zombie: IsMap() on it throws
  // YAML::InvalidNode (found by fuzz/, fuzz_graph_template: a graph with
  // edges but no nodes), so IsDefined() first; Fail at the graph, which has
  // a location.
  if (!nodes.IsDefined() || !nodes.IsMap()) {
    tmpl.Fail(graph, "graph '" + name + "'", "nodes: expected a mapping name -> {stage: ...}");
  }
  const StageRegistry& registry = StageRegistry::Get();
  for (const auto& kv : nodes) {
    NodeSpec n;
    n.name = tmpl.Name(kv.first, "graph '" + name + "' nodes");
    n.where = tmpl.Where(kv.first);
    const std::string context = StrCat("node '", n.name, "'");
    const YAML::Node params = kv.second;
    if (!params.IsMap() || !params["stage"].IsDefined()) {
      tmpl.Fail(kv.first, context, "expected a mapping with a 'stage' key");
    }
    n.stage = tmpl.Name(params["stage"], context + ": stage");
    const StageType* type = registry.Find(n.stage);
    if (type == nullptr) {
      tmpl.Fail(params["stage"], context,
                UnknownNameMessage("stage type", n.stage, registry.Names()));
    }
    for (const auto& p : params) {  // unknown keys, reported at the key itself
      const std::string key = tmpl.Name(p.first, context);
      if (key != "stage" && type->schema.Find(key) == nullptr) {
        tmpl.Fail(p.first, StrCat(context, " (", n.stage, ")"),
                  UnknownNameMessage("key", key, type->schema.Names()));
      }
    }
    YAML::Node values = Substitute(tmpl, params, run, run_doc, context);
    // Values that came from the run are checked where the template used them.
    n.args = tmpl.CheckArgs(values, type->schema, StrCat(context, " (", n.stage, ")"));
    g.nodes.push_back(std::move(n));
  }
  const YAML::Node edges = graph["edges"];
  if (!edges.IsDefined()) tmpl.Fail(graph, "graph '" + name + "'", "edges: expected a list");
  ParseEdges(tmpl, edges, g);
  g.TopologicalOrder();  // rejects cycles now
  // A node that admits a device's next batch when the optimizer is done with
  // its last one (forward_backward, pipeline_stage) would wait forever without
  // an optimizer after it.
  const GraphPlan plan = g.Plan();
  for (const std::string& name : plan.waits_for_optimizer) {
    std::set<std::string> seen{name};
    std::vector<std::string> todo{name};
    bool found = false;
    while (!todo.empty() && !found) {
      const std::string at = todo.back();
      todo.pop_back();
      for (const auto& [a, b] : g.edges) {
        if (a != at || !seen.insert(b).second) continue;
        found |= plan.optimizer_nodes.count(b) != 0;
        todo.push_back(b);
      }
    }
    if (!found) {
      const NodeSpec& n = *g.Find(name);
      throw ConfigError(StrCat(n.where, ": node '", n.name, "' (", n.stage,
                               ") needs an optimizer node after it: the optimizer lets each "
                               "next batch in"));
    }
  }
  return g;
}

GraphPlan GraphSpec::Plan() const {
  GraphPlan plan;
  for (const NodeSpec& n : nodes) {
    const StageType* type = StageRegistry::Get().Find(n.stage);
    const StagePlan* hook = Registry<StagePlan>::Get().Find(n.stage);
    if (type == nullptr || hook == nullptr) continue;
    Args args = n.args;
    args.FillDefaults(type->schema);
    hook->plan(args, PlanNode{n.name, StrCat(n.where, ": node '", n.name, "' (", n.stage, ")")},
               plan);
  }
  return plan;
}

}  // namespace cnnflow
