// The executor's promises: an exception in a node surfaces with the node's
// name instead of a hang, and graph specs check their edges and expand per
// device. The stages' own tests are in tests/stages/.
#include "pipeline/executor.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "stages/stage.h"
#include "tests/testing/stage_test_util.h"

namespace cnnflow {
namespace {

using testing::g_seen;
using testing::Graph;
using ExecutorTest = testing::StageGraphTest;

// A test-only stage, registered like any other (proof that a new stage type
// needs only its own file).
class ThrowStage final : public Stage {
 public:
  ThrowStage(const StageInfo& info, const Args& args) : Stage(info), at_(args.Int("at")) {}
  StagePorts Build(FlowGraph& g, const RunContext&, PassState&) override {
    node_ = std::make_unique<tbb::flow::function_node<Message, Message>>(
        g, tbb::flow::unlimited, [this](const Message& m) {
          return Guarded([&] {
            if (m->index == at_) throw Error(StrCat("bad batch ", m->index));
            return m;
          });
        });
    return PortsOf(*node_);
  }

 private:
  int64_t at_;
  std::unique_ptr<tbb::flow::function_node<Message, Message>> node_;
};
CNNFLOW_REGISTER_STAGE(
    test_throw, ThrowStage,
    Schema("test: throws at one batch").Required("at", ParamType::kInt, "batch"));

TEST_F(ExecutorTest, ExceptionInNodeNamesTheNodeAndDoesNotHang) {
  const GraphSpec spec = Graph(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 5}
    prefetch: {stage: prefetch, depth: 2}
    load: {stage: load_batch, threads: 2}
    boom: {stage: test_throw, at: 7}
    record: {stage: test_record}
  edges: [sample -> prefetch -> load -> boom -> record]
)");
  try {
    RunGraph(spec, run, *pass);
    FAIL() << "expected an exception";
  } catch (const StageError& e) {
    EXPECT_NE(std::string(e.what()).find("node 'boom' (test_throw): bad batch 7"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(g_seen.size(), 40u);
}

TEST_F(ExecutorTest, ExceptionInDataNamesTheLoadNode) {
  run.datasets.erase("train");
  const GraphSpec spec = Graph(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 5}
    record: {stage: test_record}
  edges: [sample -> record]
)");
  try {
    RunGraph(spec, run, *pass);
    FAIL() << "expected an exception";
  } catch (const StageError& e) {
    EXPECT_NE(std::string(e.what()).find("node 'sample' (sampler): no data set 'train'"),
              std::string::npos)
        << e.what();
  }
}

TEST(GraphSpec, RejectsUnknownNodeInEdgeAndCycles) {
  try {
    Graph(
        "train:\n  nodes:\n    a: {stage: sampler, batch: 2}\n    b: {stage: test_record}\n"
        "  edges: [a -> c]\n");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(
        std::string(e.what()).find("test_graph.yaml:5:11: graph 'train' edges: unknown node 'c'"),
        std::string::npos)
        << e.what();
  }
  try {
    Graph(
        "train:\n  nodes:\n    a: {stage: test_record}\n    b: {stage: test_record}\n"
        "  edges: [a -> b, b -> a]\n");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("has a cycle"), std::string::npos) << e.what();
  }
}

// The graph as it runs on two devices: the per-device stages become a node
// per device, joined lane to lane, fanned out from the loader and in to
// the sink.
TEST(GraphSpec, ExpandsPerDeviceStagesIntoLanes) {
  const GraphSpec g = Graph(
      "train:\n  nodes:\n    load: {stage: test_record}\n    fb: {stage: forward_backward}\n"
      "    ar: {stage: allreduce}\n    opt: {stage: optimizer}\n    end: {stage: metrics}\n"
      "  edges: [load -> fb -> ar -> opt -> end]\n");
  const GraphSpec::Expanded x = g.Expand({"cpu:0", "cpu:1"});
  std::vector<std::string> names, edges;
  for (const auto& n : x.nodes) names.push_back(n.name);
  for (const auto& e : x.edges) edges.push_back(x.nodes[e.from].name + " -> " + x.nodes[e.to].name);
  EXPECT_EQ(names, (std::vector<std::string>{"load", "fb[cpu:0]", "fb[cpu:1]", "ar[cpu:0]",
                                             "ar[cpu:1]", "opt[cpu:0]", "opt[cpu:1]", "end"}));
  EXPECT_EQ(edges, (std::vector<std::string>{"load -> fb[cpu:0]", "load -> fb[cpu:1]",
                                             "fb[cpu:0] -> ar[cpu:0]", "fb[cpu:1] -> ar[cpu:1]",
                                             "ar[cpu:0] -> opt[cpu:0]", "ar[cpu:1] -> opt[cpu:1]",
                                             "opt[cpu:0] -> end", "opt[cpu:1] -> end"}));
  EXPECT_EQ(g.Expand({}).nodes.size(), 5u) << "no devices: the graph as written";
  const std::string dot = g.ToDot({"cpu:0", "cpu:1"});
  EXPECT_NE(dot.find("subgraph \"cluster_train\""), std::string::npos) << dot;
  EXPECT_NE(dot.find("\"train.fb[cpu:1]\" -> \"train.ar[cpu:1]\";"), std::string::npos) << dot;
  EXPECT_EQ(dot.find("\"train.fb[cpu:0]\" -> \"train.ar[cpu:1]\""), std::string::npos) << dot;
}

// Pipeline stages: a node per device, each messaging its neighbours
// (activations on, gradients back) besides its lane.
TEST(GraphSpec, ExpandsPipelineStagesIntoAChain) {
  const GraphSpec g = Graph(
      "train:\n  nodes:\n    load: {stage: test_record}\n    st: {stage: pipeline_stage}\n"
      "    opt: {stage: optimizer}\n    end: {stage: metrics}\n"
      "  edges: [load -> st -> opt -> end]\n");
  const GraphSpec::Expanded x = g.Expand({"cpu:0", "cpu:1", "cpu:2"});
  std::vector<std::string> chain;
  for (const auto& e : x.edges) {
    if (!e.label.empty())
      chain.push_back(x.nodes[e.from].name + " -> " + x.nodes[e.to].name + " " + e.label);
  }
  EXPECT_EQ(chain, (std::vector<std::string>{
                       "st[cpu:0] -> st[cpu:1] activations", "st[cpu:1] -> st[cpu:0] gradients",
                       "st[cpu:1] -> st[cpu:2] activations", "st[cpu:2] -> st[cpu:1] gradients"}));
  EXPECT_NE(g.ToString({"cpu:0", "cpu:1"})
                .find("st[cpu:1] (pipeline_stage) -> st[cpu:0] (gradients), opt[cpu:1]"),
            std::string::npos)
      << g.ToString({"cpu:0", "cpu:1"});
  EXPECT_NE(g.ToDot({"cpu:0", "cpu:1"})
                .find("\"train.st[cpu:0]\" -> \"train.st[cpu:1]\" [label=\"activations\""),
            std::string::npos);
}

}  // namespace
}  // namespace cnnflow
