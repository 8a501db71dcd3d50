#include "tests/testing/stage_test_util.h"

#include <chrono>
#include <memory>
#include <thread>

#include "ops/random.h"
#include "stages/stage.h"

namespace cnnflow::testing {

ReadResult JitterDataset::Read(int64_t index, const ReadContext&, float* dst) const {
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

std::string JitterDataset::Key(int64_t index) const { return StrCat("k", index); }

std::mutex g_mu;
std::vector<int64_t> g_seen;
std::vector<BatchMessage> g_captured;

GraphSpec Graph(const std::string& text) {
  YamlDoc doc = YamlDoc::Parse(text, "test_graph.yaml");
  YAML::Node run(YAML::NodeType::Map);
  return ParseGraph(doc, "train", run, doc);
}

namespace {

// Test-only stages, registered like any other (proof that a new stage type
// needs only its own file).
class RecordStage final : public Stage {
 public:
  RecordStage(const StageInfo& info, const Args& args)
      : Stage(info), sleep_us_(args.Int("sleep_us")) {}
  StagePorts Build(FlowGraph& g, const RunContext&, PassState&) override {
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

// Keeps every batch that reaches it (inputs copied, labels and mixing).
class CaptureStage final : public Stage {
 public:
  CaptureStage(const StageInfo& info, const Args&) : Stage(info) {}
  StagePorts Build(FlowGraph& g, const RunContext&, PassState&) override {
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

}  // namespace
}  // namespace cnnflow::testing
