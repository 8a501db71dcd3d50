// metrics: the sink of a pass. Adds each batch's loss and correct count to
// the pass totals and reports progress.
#include <tbb/flow_graph.h>

#include "stages/pass_state.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

class MetricsStage final : public Stage {
 public:
  MetricsStage(const StageInfo& info, const Args&) : Stage(info) {}

  StagePorts Build(FlowGraph& g, const RunContext&, PassState& pass) override {
    node_ = std::make_unique<tbb::flow::function_node<Message, Message>>(
        g, tbb::flow::serial, [this, &pass](const Message& m) {
          return Guarded([&] {
            PassMetrics& p = pass.metrics;
            const auto n = static_cast<int64_t>(m->labels.size());
            p.Add(m->loss, m->correct, n);
            p.batches += 1;
            p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - pass.start)
                            .count();
            if (pass.on_batch) pass.on_batch(*m, pass);
            return m;
          });
        });
    return PortsOf(*node_);
  }

 private:
  std::unique_ptr<tbb::flow::function_node<Message, Message>> node_;
};

}  // namespace

CNNFLOW_REGISTER_STAGE(metrics, MetricsStage,
                       Schema("Sink of a pass: sums loss and accuracy over its batches and reports "
                              "progress."));

}  // namespace cnnflow
