// eval_step: forward in evaluation mode (BN running statistics, no
// dropout), loss and correct predictions; no gradients. The batch goes
// through the model `micro_batch` rows at a time, each forward freeing its
// activations as it goes, so evaluating a batch of 1000 costs the memory
// of a forward of `micro_batch` rows (the templates pass train.batch: the
// buffers training already holds).
#include <tbb/flow_graph.h>

#include <algorithm>

#include "ops/device_ops.h"
#include "ops/loss.h"
#include "ops/trace.h"
#include "stages/run_state.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

class EvalStepStage final : public Stage {
 public:
  EvalStepStage(const StageInfo& info, const Args& args)
      : Stage(info), micro_batch_(args.Int("micro_batch")) {
    if (micro_batch_ < 0) {
      throw ConfigError(StrCat("node '", info.node, "' (eval_step): micro_batch must be >= 0, got ",
                               micro_batch_));
    }
  }

  StagePorts Build(FlowGraph& g, RunState& state) override {
    node_ = std::make_unique<tbb::flow::function_node<Message, Message>>(
        g, tbb::flow::serial, [this, &state](const Message& m) {
          return Guarded([&] {
            if (m->labels.empty()) return m;  // every record was bad and skipped
            const TraceSpan span("eval", "eval batch");
            Evaluate(state, *m);
            return m;
          });
        });
    return PortsOf(*node_);
  }

 private:
  // The batch's rows through the model micro_batch_ at a time (each row's
  // logits do not depend on the others in evaluation mode), freeing
  // activations as each forward goes: the memory of a forward of
  // micro_batch_ rows, not of the whole batch.
  // With tensor parallelism every member of group 0 runs the forward.
  void Evaluate(RunState& state, BatchMessage& m) const {
    Model& model = *state.model;
    const uint64_t seed = state.seed;
    const Device device = model.device();
    const int64_t n = m.inputs.dim(0);
    const int64_t chunk = micro_batch_ > 0 ? std::min(micro_batch_, n) : n;
    ForwardContext ctx;
    ctx.training = false;
    ctx.seed = seed;
    ctx.step = m.global_step;
    ctx.keep_activations = false;
    Tensor inputs = m.inputs;
    Tensor labels;  // on a GPU
    const int64_t* label_data = m.labels.data();
    if (device.is_cuda()) {
      inputs = m.inputs.To(device);
      labels = LabelTensor(m.labels.data(), static_cast<int64_t>(m.labels.size()), device);
      label_data = labels.data<int64_t>();
    }
    auto run = [&](int64_t b, int64_t e) {
      const Tensor& x = e - b == n ? inputs : inputs.Slice(b, e);
      const Tensor& logits = state.replicas != nullptr && state.replicas->tensor_parallel() > 1
                                 ? state.replicas->Infer(x, ctx)
                                 : model.Forward(x, ctx);
      return SoftmaxCrossEntropyAsync(logits, label_data + b, nullptr)->Get();
    };
    if (chunk == n) {  // one forward: its mean loss as it is
      const LossResult r = run(0, n);
      m.loss = r.loss;
      m.correct = r.correct;
      return;
    }
    double loss_sum = 0;  // of the chunks' mean losses x their rows
    int64_t correct = 0;
    for (int64_t b = 0; b < n; b += chunk) {
      const int64_t e = std::min(n, b + chunk);
      const LossResult r = run(b, e);
      loss_sum += r.loss * static_cast<double>(e - b);
      correct += r.correct;
    }
    m.loss = loss_sum / static_cast<double>(n);
    m.correct = correct;
  }

  int64_t micro_batch_;
  std::unique_ptr<tbb::flow::function_node<Message, Message>> node_;
};

}  // namespace

CNNFLOW_REGISTER_STAGE(eval_step, EvalStepStage,
                       Schema("Forward in evaluation mode, activations freed as it goes; loss and "
                              "correct predictions per batch.")
                           .Optional("micro_batch", ParamType::kInt, int64_t{0},
                                     "rows per forward (0: the whole batch); the batch's loss "
                                     "and accuracy are the same up to float rounding, and the "
                                     "memory is that of a forward of this many rows"));

}  // namespace cnnflow
