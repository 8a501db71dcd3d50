// train_step: one optimizer step per batch on one device: forward, softmax
// cross-entropy, backward, then the optimizer with the scheduled LR.
#include <cmath>

#include <tbb/flow_graph.h>

#include "ops/loss.h"
#include "stages/run_state.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

class TrainStepStage final : public Stage {
 public:
  TrainStepStage(const StageInfo& info, const Args&) : Stage(info) {}

  StagePorts Build(FlowGraph& g, RunState& state) override {
    node_ = std::make_unique<tbb::flow::function_node<Message, Message>>(
        g, tbb::flow::serial, [this, &state](const Message& m) {
          return Guarded([&] {
            Step(state, *m);
            return m;
          });
        });
    return PortsOf(*node_);
  }

 private:
  static void Step(RunState& s, BatchMessage& m) {
    CNNFLOW_ENFORCE(s.model && s.optimizer && s.schedule, "train_step needs a model and optimizer");
    if (m.labels.empty()) {  // every record of the batch was bad and skipped
      s.global_step = m.global_step + 1;
      return;
    }
    ForwardContext ctx{true, s.seed, m.global_step};
    s.model->ZeroGrad();
    const Tensor& logits = s.model->Forward(m.inputs, ctx);
    Tensor dlogits = Tensor::Empty(logits.shape(), logits.dtype());
    LossResult r = SoftmaxCrossEntropy(logits, m.labels.data(), &dlogits, -1, s.label_smoothing);
    if (!std::isfinite(r.loss)) {
      throw Error(StrCat("loss is ", r.loss, " at step ", m.global_step, " (epoch ", m.epoch + 1,
                         ", batch ", m.index + 1, "): lower the learning rate or check the data"));
    }
    s.model->Backward(dlogits);
    m.lr = s.schedule->At(m.global_step);
    s.optimizer->Step(m.lr);
    m.loss = r.loss;
    m.correct = r.correct;
    s.global_step = m.global_step + 1;
  }

  std::unique_ptr<tbb::flow::function_node<Message, Message>> node_;
};

}  // namespace

CNNFLOW_REGISTER_STAGE(train_step, TrainStepStage,
                       Schema("Forward, loss, backward and one optimizer step per batch, on one "
                              "device (the model's)."));

}  // namespace cnnflow
