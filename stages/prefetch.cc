// prefetch: bounds the batches in flight. A limiter_node passes at most
// `depth` messages; each gives its token back when it leaves the graph, so
// at most `depth` batches are being loaded or waiting for the step, and
// their memory is known before the run starts.
#include <tbb/flow_graph.h>

#include "stages/run_state.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

class PrefetchStage final : public Stage {
 public:
  PrefetchStage(const StageInfo& info, const Args& args) : Stage(info), depth_(args.Int("depth")) {
    if (depth_ <= 0) throw ConfigError(StrCat("depth must be > 0, got ", depth_));
  }

  StagePorts Build(FlowGraph& g, RunState& state) override {
    state_ = &state;
    limiter_ = std::make_unique<tbb::flow::limiter_node<Message>>(g, static_cast<size_t>(depth_));
    // Counts what passed the limiter (for reports and the bound's test).
    count_ = std::make_unique<tbb::flow::function_node<Message, Message>>(
        g, tbb::flow::unlimited, [&state](const Message& m) {
          const int64_t now = ++state.in_flight;
          int64_t seen = state.max_in_flight.load();
          while (now > seen && !state.max_in_flight.compare_exchange_weak(seen, now)) {
          }
          return m;
        });
    tbb::flow::make_edge(*limiter_, *count_);
    StagePorts ports;
    ports.input = limiter_.get();
    ports.output = count_.get();
    ports.is_limiter = true;
    return ports;
  }

  void Release() override {
    --state_->in_flight;
    limiter_->decrementer().try_put(tbb::flow::continue_msg());
  }

 private:
  int64_t depth_;
  RunState* state_ = nullptr;
  std::unique_ptr<tbb::flow::limiter_node<Message>> limiter_;
  std::unique_ptr<tbb::flow::function_node<Message, Message>> count_;
};

}  // namespace

CNNFLOW_REGISTER_STAGE(prefetch, PrefetchStage,
                       Schema("Bounded prefetch: at most `depth` batches between this node and the "
                              "end of the graph (a limiter_node; tokens return when a batch leaves).")
                           .Optional("depth", ParamType::kInt, int64_t{4},
                                     "batches in flight at most"));

}  // namespace cnnflow
