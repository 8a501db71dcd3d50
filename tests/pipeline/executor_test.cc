// The executor's promises: order where order is promised, the prefetch
// bound, and an exception in a node that surfaces with the node's name
// instead of a hang.
#include "pipeline/executor.h"

#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "ops/random.h"
#include "stages/run_state.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

// A data set whose reads take a random few hundred microseconds, so batches
// loaded concurrently finish out of order.
class JitterDataset : public Dataset {
 public:
  explicit JitterDataset(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Shape sample_shape() const override { return {1, 2, 2}; }
  int num_classes() const override { return 10; }
  ReadResult Read(int64_t index, const ReadContext&, float* dst) const override {
    const int64_t now = ++reading_;
    if (index >= watch_from_) {
      int64_t seen = max_reading_.load();
      while (now > seen && !max_reading_.compare_exchange_weak(seen, now)) {
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50 + Mix64(index) % 400));
    --reading_;
    for (int i = 0; i < 4; ++i) dst[i] = static_cast<float>(index);
    if (bad_every_ > 0 && index % bad_every_ == 3) return {-1, "corrupt record"};
    return {index % 10, ""};
  }
  std::string Key(int64_t index) const override { return StrCat("k", index); }
  int64_t bad_every_ = 0;  // every record with index % bad_every_ == 3 is bad
  // Reads running at once, and the most seen by reads of index >= watch_from_.
  mutable std::atomic<int64_t> reading_{0}, max_reading_{0};
  int64_t watch_from_ = 0;
  std::string description() const override { return "jitter"; }

 private:
  int64_t n_;
};

// Test-only stages, registered like any other (proof that a new stage type
// needs only its own file).
std::mutex g_mu;
std::vector<int64_t> g_seen;

class RecordStage final : public Stage {
 public:
  RecordStage(const StageInfo& info, const Args& args)
      : Stage(info), sleep_us_(args.Int("sleep_us")) {}
  StagePorts Build(FlowGraph& g, RunState&) override {
    node_ = std::make_unique<tbb::flow::function_node<Message, Message>>(
        g, tbb::flow::serial, [this](const Message& m) {
          std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
          std::lock_guard<std::mutex> lock(g_mu);
          g_seen.push_back(m->index);
          return m;
        });
    return PortsOf(*node_);
  }

 private:
  int64_t sleep_us_;
  std::unique_ptr<tbb::flow::function_node<Message, Message>> node_;
};
CNNFLOW_REGISTER_STAGE(test_record, RecordStage,
                       Schema("test: records batch indices")
                           .Optional("sleep_us", ParamType::kInt, int64_t{0}, "delay"));

class ThrowStage final : public Stage {
 public:
  ThrowStage(const StageInfo& info, const Args& args) : Stage(info), at_(args.Int("at")) {}
  StagePorts Build(FlowGraph& g, RunState&) override {
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

// Keeps every batch that reaches it (inputs copied, labels and mixing).
std::vector<BatchMessage> g_captured;
class CaptureStage final : public Stage {
 public:
  CaptureStage(const StageInfo& info, const Args&) : Stage(info) {}
  StagePorts Build(FlowGraph& g, RunState&) override {
    node_ = std::make_unique<tbb::flow::function_node<Message, Message>>(
        g, tbb::flow::serial, [](const Message& m) {
          std::lock_guard<std::mutex> lock(g_mu);
          g_captured.push_back(*m);
          g_captured.back().inputs = m->inputs.Clone();
          return m;
        });
    return PortsOf(*node_);
  }

 private:
  std::unique_ptr<tbb::flow::function_node<Message, Message>> node_;
};
CNNFLOW_REGISTER_STAGE(test_capture, CaptureStage, Schema("test: keeps every batch"));

GraphSpec Graph(const std::string& text) {
  YamlDoc doc = YamlDoc::Parse(text, "test_graph.yaml");
  YAML::Node run(YAML::NodeType::Map);
  return ParseGraph(doc, "train", run, doc);
}

struct ExecutorTest : ::testing::Test {
  void SetUp() override {
    state.datasets["train"] = std::make_shared<JitterDataset>(200);
    g_seen.clear();
  }
  RunState state;
  tbb::global_control threads{tbb::global_control::max_allowed_parallelism, 4};
};

TEST_F(ExecutorTest, OrderedLoadDeliversBatchesInSamplerOrder) {
  RunGraph(Graph(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 5}
    prefetch: {stage: prefetch, depth: 8}
    load: {stage: load_batch, threads: 4}
    record: {stage: test_record}
  edges: [sample -> prefetch -> load -> record]
)"),
           state);
  ASSERT_EQ(g_seen.size(), 40u);
  for (int64_t i = 0; i < 40; ++i) EXPECT_EQ(g_seen[i], i);
}

TEST_F(ExecutorTest, UnorderedLoadStillDeliversEveryBatchOnce) {
  RunGraph(Graph(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 5}
    prefetch: {stage: prefetch, depth: 8}
    load: {stage: load_batch, threads: 4, ordered: false}
    record: {stage: test_record}
  edges: [sample -> prefetch -> load -> record]
)"),
           state);
  std::vector<int64_t> sorted = g_seen;
  std::sort(sorted.begin(), sorted.end());
  ASSERT_EQ(sorted.size(), 40u);
  for (int64_t i = 0; i < 40; ++i) EXPECT_EQ(sorted[i], i);
}

TEST_F(ExecutorTest, PrefetchBoundsBatchesInFlight) {
  // A slow consumer behind four loader threads: without the limiter every
  // batch would be loaded at once.
  RunGraph(Graph(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 4}
    prefetch: {stage: prefetch, depth: 3}
    load: {stage: load_batch, threads: 4}
    record: {stage: test_record, sleep_us: 3000}
  edges: [sample -> prefetch -> load -> record]
)"),
           state);
  EXPECT_EQ(g_seen.size(), 50u);
  EXPECT_LE(state.max_in_flight.load(), 3);
  EXPECT_EQ(state.max_in_flight.load(), 3) << "the consumer is slow: the bound should be reached";
  EXPECT_EQ(state.in_flight.load(), 0);
}

TEST_F(ExecutorTest, PrefetchMemoryBudgetCapsBatchesInFlight) {
  state.batch_bytes = 4 * 4 * 4;  // batch 4 x [1, 2, 2] floats = 64 bytes
  RunGraph(Graph(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 4}
    prefetch: {stage: prefetch, depth: 8, memory_mb: 0.0002}
    load: {stage: load_batch, threads: 4}
    record: {stage: test_record, sleep_us: 3000}
  edges: [sample -> prefetch -> load -> record]
)"),
           state);
  EXPECT_EQ(g_seen.size(), 50u);
  // 200 bytes hold 3 batches of 64, though depth allows 8.
  EXPECT_EQ(state.max_in_flight.load(), 3);
}

TEST_F(ExecutorTest, PrefetchBudgetSmallerThanABatchIsAnError) {
  state.batch_bytes = 3'000'000;
  try {
    RunGraph(
        Graph("train:\n  nodes:\n    sample: {stage: sampler, batch: 4}\n"
              "    prefetch: {stage: prefetch, memory_mb: 2}\n    record: {stage: test_record}\n"
              "  edges: [sample -> prefetch -> record]\n"),
        state);
    FAIL() << "expected an error";
  } catch (const StageError& e) {
    EXPECT_NE(std::string(e.what()).find("node 'prefetch' (prefetch): memory_mb 2 holds no batch: "
                                         "one batch is 3 MB"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(ExecutorTest, DecodeConcurrencyIsBoundedByLoadThreads) {
  auto data = std::make_shared<JitterDataset>(200);
  state.datasets["train"] = data;
  RunGraph(Graph(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 8}
    prefetch: {stage: prefetch, depth: 8}
    load: {stage: load_batch, threads: 2, slice: 2}
    record: {stage: test_record}
  edges: [sample -> prefetch -> load -> record]
)"),
           state);
  EXPECT_EQ(g_seen.size(), 25u);
  EXPECT_EQ(data->max_reading_.load(), 2) << "4 TBB threads, 2 decode tasks at most";
}

TEST_F(ExecutorTest, KnobsMoveDecodeConcurrencyWhileRunning) {
  // Batch 10 lowers load.threads from 4 to 1, then (second run) raises it
  // from 1 to 4; reads of later batches see the new bound.
  for (const auto& [from, to] : {std::pair<int64_t, int64_t>{4, 1}, {1, 4}}) {
    auto data = std::make_shared<JitterDataset>(400);
    data->watch_from_ = 200;  // batch 20 on: long after the move
    state.datasets["train"] = data;
    state.knobs.clear();
    state.metrics = PassMetrics();
    state.on_batch = [&, to = to](const BatchMessage& m, const PassMetrics&) {
      if (m.index != 10) return;
      for (TunableKnob& k : state.knobs)
        if (k.name == "load.threads") {
          EXPECT_EQ(k.set(to), to);
        }
    };
    state.threads = 4;
    RunGraph(Graph(StrCat(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 10, shuffle: false}
    prefetch: {stage: prefetch, depth: 4}
    load: {stage: load_batch, threads: )",
                          from, R"(, slice: 1}
    metrics: {stage: metrics}
  edges: [sample -> prefetch -> load -> metrics]
)")),
             state);
    EXPECT_EQ(state.metrics.samples, 400);
    if (to == 1) {
      EXPECT_EQ(data->max_reading_.load(), 1);
    } else {
      EXPECT_GE(data->max_reading_.load(), 2);
    }
  }
}

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
    RunGraph(spec, state);
    FAIL() << "expected an exception";
  } catch (const StageError& e) {
    EXPECT_NE(std::string(e.what()).find("node 'boom' (test_throw): bad batch 7"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(g_seen.size(), 40u);
}

TEST_F(ExecutorTest, ExceptionInDataNamesTheLoadNode) {
  state.datasets.erase("train");
  const GraphSpec spec = Graph(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 5}
    record: {stage: test_record}
  edges: [sample -> record]
)");
  try {
    RunGraph(spec, state);
    FAIL() << "expected an exception";
  } catch (const StageError& e) {
    EXPECT_NE(std::string(e.what()).find("node 'sample' (sampler): no data set 'train'"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(ExecutorTest, BadRecordFailsTheRunNamingItsKey) {
  auto data = std::make_shared<JitterDataset>(200);
  data->bad_every_ = 50;  // records 3, 53, 103, 153
  state.datasets["train"] = data;
  try {
    RunGraph(Graph(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 5, shuffle: false}
    load: {stage: load_batch}
    record: {stage: test_record}
  edges: [sample -> load -> record]
)"),
             state);
    FAIL() << "expected an exception";
  } catch (const StageError& e) {
    EXPECT_NE(std::string(e.what()).find("node 'load' (load_batch): bad record k3 (sample 3): "
                                         "corrupt record (on_bad_record: fail)"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(ExecutorTest, BadRecordsAreSkippedCountedAndNamed) {
  auto data = std::make_shared<JitterDataset>(200);
  data->bad_every_ = 50;
  state.datasets["train"] = data;
  int64_t samples = 0;
  state.on_batch = [&](const BatchMessage& m, const PassMetrics&) {
    samples += static_cast<int64_t>(m.labels.size());
    // The kept samples moved up with their labels: a sample's pixels hold
    // its index, its label is index % 10, and no bad index is left.
    ASSERT_EQ(m.inputs.dim(0), static_cast<int64_t>(m.labels.size()));
    for (size_t i = 0; i < m.labels.size(); ++i) {
      const auto index = static_cast<int64_t>(m.inputs.At(static_cast<int64_t>(i) * 4));
      EXPECT_EQ(index % 10, m.labels[i]);
      EXPECT_NE(index % 50, 3);
    }
  };
  RunGraph(Graph(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 5, shuffle: false}
    prefetch: {stage: prefetch, depth: 4}
    load: {stage: load_batch, threads: 2, on_bad_record: skip}
    metrics: {stage: metrics}
  edges: [sample -> prefetch -> load -> metrics]
)"),
           state);
  EXPECT_EQ(samples, 196);
  EXPECT_EQ(state.metrics.samples, 196);
  std::vector<std::string> bad = state.bad_records;
  std::sort(bad.begin(), bad.end());
  EXPECT_EQ(bad, (std::vector<std::string>{
                     "k103 (sample 103): corrupt record", "k153 (sample 153): corrupt record",
                     "k3 (sample 3): corrupt record", "k53 (sample 53): corrupt record"}));
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

// mixup: row i = lam * row i + (1 - lam) * row N-1-i, target lam of its
// label and the rest of row N-1-i's; the same draws on a second run (keyed
// by the batch's position); cutmix: a box of row N-1-i, lam the area kept.
TEST_F(ExecutorTest, MixupAndCutmixMixRowsWithTheirMirrorAndSayHowMuch) {
  for (const char* type : {"mixup", "cutmix"}) {
    SCOPED_TRACE(type);
    std::vector<std::vector<BatchMessage>> runs;
    for (int run = 0; run < 2; ++run) {
      g_captured.clear();
      state.seed = 5;
      RunGraph(Graph(StrCat("train:\n  nodes:\n    sample: {stage: sampler, batch: 5}\n"
                            "    load: {stage: load_batch}\n    mix: {stage: ",
                            type,
                            ", alpha: 1.0}\n    keep: {stage: test_capture}\n"
                            "  edges: [sample -> load -> mix -> keep]\n")),
               state);
      runs.push_back(g_captured);
    }
    ASSERT_EQ(runs[0].size(), 40u);
    std::set<float> lams;
    for (size_t b = 0; b < runs[0].size(); ++b) {
      const BatchMessage& m = runs[0][b];
      const int64_t n = static_cast<int64_t>(m.labels.size());
      ASSERT_EQ(static_cast<int64_t>(m.mix_labels.size()), n);
      const float lam = m.mix_weights[0];
      lams.insert(lam);
      EXPECT_EQ(runs[1][b].mix_weights, m.mix_weights) << "the second run drew differently";
      for (int64_t i = 0; i < n; ++i) {
        const int64_t j = n - 1 - i;
        EXPECT_EQ(m.mix_labels[i], m.labels[j]);
        EXPECT_FLOAT_EQ(m.mix_weights[i], i == j ? 1.0f : lam);
        // JitterDataset's sample `index` holds 4 copies of its index.
        const double vi = static_cast<double>(m.sample_ids[i]);
        const double vj = static_cast<double>(m.sample_ids[j]);
        int64_t from_j = 0;
        for (int e = 0; e < 4; ++e) {
          const double got = m.inputs.At(i * 4 + e);
          if (std::string(type) == "mixup") {
            EXPECT_NEAR(got, lam * vi + (1 - lam) * vj, 1e-4) << "batch " << b << " row " << i;
          } else {
            EXPECT_TRUE(got == vi || got == vj) << got;
            from_j += got == vj && vi != vj;
          }
        }
        if (std::string(type) == "cutmix" && i != j) {
          EXPECT_NEAR(1.0 - from_j / 4.0, lam, 1e-6) << "lam is not the area kept";
        }
      }
    }
    EXPECT_GT(lams.size(), 3u) << "lam is not drawn per batch";
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
