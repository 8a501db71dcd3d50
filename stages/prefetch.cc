// prefetch: bounds the batches in flight. A limiter_node passes at most
// `depth` messages; each gives its token back when it leaves the graph, so
// at most `depth` batches are being loaded or waiting for the step, and
// their memory is known before the run starts. With `memory_mb`, the depth
// is also capped so that depth x batch bytes stays within the budget.
#include <tbb/flow_graph.h>

#include <cmath>

#include "stages/adjustable_limiter.h"
#include "stages/pass_state.h"
#include "stages/run_context.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

class PrefetchStage final : public Stage {
 public:
  PrefetchStage(const StageInfo& info, const Args& args)
      : Stage(info), depth_(args.Int("depth")), memory_mb_(args.Float("memory_mb")) {
    if (depth_ <= 0) throw ConfigError(StrCat("depth must be > 0, got ", depth_));
    if (memory_mb_ < 0) throw ConfigError(StrCat("memory_mb must be >= 0, got ", memory_mb_));
  }

  StagePorts Build(FlowGraph& g, const RunContext& run, PassState& pass) override {
    control_ = run.control;
    // Without a budget, autotuning may go up to 4x the configured depth.
    int64_t max_depth = std::max<int64_t>(depth_, std::min<int64_t>(4 * depth_, 32));
    if (memory_mb_ > 0 && pass.batch_bytes > 0) {
      const auto fit = static_cast<int64_t>(std::floor(memory_mb_ * 1e6 / pass.batch_bytes));
      if (fit < 1) {
        throw ConfigError(StrCat("memory_mb ", memory_mb_, " holds no batch: one batch is ",
                                 pass.batch_bytes / 1e6, " MB"));
      }
      max_depth = fit;
    }
    const std::string knob = info().node + ".depth";
    int64_t depth = std::min(depth_, max_depth);
    if (auto it = pass.tuned.find(knob); it != pass.tuned.end()) depth = it->second;
    depth = std::clamp<int64_t>(depth, 1, max_depth);
    limiter_ = std::make_unique<AdjustableLimiter<Message>>(g, depth, max_depth);
    pass.knobs.push_back({knob, depth, 1, max_depth, /*doubling=*/true,
                          [this](int64_t v) { return limiter_->SetLimit(v); }});
    // Counts what passed the limiter (for reports and the bound's test).
    count_ = std::make_unique<tbb::flow::function_node<Message, Message>>(
        g, tbb::flow::unlimited, [control = control_](const Message& m) {
          const int64_t now = ++control->in_flight;
          int64_t seen = control->max_in_flight.load();
          while (now > seen && !control->max_in_flight.compare_exchange_weak(seen, now)) {
          }
          return m;
        });
    tbb::flow::make_edge(limiter_->node(), *count_);
    StagePorts ports;
    ports.input = &limiter_->node();
    ports.output = count_.get();
    ports.is_limiter = true;
    return ports;
  }

  void Release() override {
    --control_->in_flight;
    limiter_->Release();
  }

 private:
  int64_t depth_;
  double memory_mb_;
  RunControl* control_ = nullptr;
  std::unique_ptr<AdjustableLimiter<Message>> limiter_;
  std::unique_ptr<tbb::flow::function_node<Message, Message>> count_;
};

}  // namespace

CNNFLOW_REGISTER_STAGE(
    prefetch, PrefetchStage,
    Schema("Bounded prefetch: at most `depth` batches between this node and the "
           "end of the graph (a limiter_node; tokens return when a batch leaves).")
        .Optional("depth", ParamType::kInt, int64_t{4}, "batches in flight at most")
        .Optional("memory_mb", ParamType::kFloat, 0.0,
                  "memory budget of the batches in flight, in MB (0: none); "
                  "caps depth"));

// The batches in flight: what `cnnflow validate` counts the input memory by,
// and `cnnflow tune` varies.
CNNFLOW_STAGE_PLAN(prefetch, [](const Args& a, const PlanNode& node, GraphPlan& plan) {
  plan.prefetch_depth_args.push_back({node.name, "depth"});
  plan.prefetch_depth += a.Int("depth");
  plan.prefetch_memory_mb += a.Float("memory_mb");
});

}  // namespace cnnflow
