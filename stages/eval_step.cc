// eval_step: forward in evaluation mode (BN running statistics, no
// dropout), loss and correct predictions; no gradients.
#include <tbb/flow_graph.h>

#include "ops/cuda/kernels.h"
#include "ops/loss.h"
#include "ops/trace.h"
#include "stages/run_state.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

class EvalStepStage final : public Stage {
 public:
  EvalStepStage(const StageInfo& info, const Args&) : Stage(info) {}

  StagePorts Build(FlowGraph& g, RunState& state) override {
    node_ = std::make_unique<tbb::flow::function_node<Message, Message>>(
        g, tbb::flow::serial, [this, &state](const Message& m) {
          return Guarded([&] {
            if (m->labels.empty()) return m;  // every record was bad and skipped
            const TraceSpan span("eval", "eval batch");
            ForwardContext ctx{false, state.seed, m->global_step};
            const Device device = state.model->device();
            LossResult r;
            if (device.is_cuda()) {
              const Tensor& logits = state.model->Forward(m->inputs.To(device), ctx);
              Tensor labels = Tensor::Empty(Shape({static_cast<int64_t>(m->labels.size())}),
                                            DType::kF64, device);  // int64 bits
              CopyBytes(device, labels.raw_data(), Device::Cpu(), m->labels.data(),
                        m->labels.size() * sizeof(int64_t));
              r = cuda::SoftmaxCrossEntropy(logits, static_cast<const int64_t*>(labels.raw_data()),
                                            nullptr);
            } else {
              const Tensor& logits = state.model->Forward(m->inputs, ctx);
              r = SoftmaxCrossEntropy(logits, m->labels.data(), nullptr);
            }
            m->loss = r.loss;
            m->correct = r.correct;
            return m;
          });
        });
    return PortsOf(*node_);
  }

 private:
  std::unique_ptr<tbb::flow::function_node<Message, Message>> node_;
};

}  // namespace

CNNFLOW_REGISTER_STAGE(eval_step, EvalStepStage,
                       Schema("Forward in evaluation mode; loss and correct predictions per batch."));

}  // namespace cnnflow
