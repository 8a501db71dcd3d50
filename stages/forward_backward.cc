// forward_backward: each replica's forward, loss and backward on its rows
// of the batch (ops/parallel/data_parallel.h), one lane per device of graph.devices:
//
//   split -> queue r -> gate r -> replica r     (r = 0 .. N-1)
//
// split:   hands the batch to every lane; for GPU replicas it starts copying
//          each replica's rows to its GPU (ops/cuda/batch_stager.h), so that copy
//          runs while the replica is still computing the previous batch;
// gate r:  admits replica r's next batch once the optimizer stage is done
//          with its previous one (RunState::lanes): until then its
//          parameters are being reduced and updated;
// replica: forward, loss and backward of its shard in its own task arena.
//          At the last micro-batch of an accumulation window, each gradient
//          bucket is all-reduced as soon as backward has filled it, and the
//          BN buffers are broadcast after (the allreduce stage waits for
//          them). Emits the batch on lane r.
#include <tbb/flow_graph.h>

#include "ops/test_fault.h"
#include "ops/trace.h"
#include "stages/run_state.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

class ForwardBackwardStage final : public Stage {
 public:
  ForwardBackwardStage(const StageInfo& info, const Args&) : Stage(info) {}

  StagePorts Build(FlowGraph& g, RunState& state) override {
    using namespace tbb::flow;
    CNNFLOW_ENFORCE(state.replicas != nullptr, "forward_backward needs replicas");
    const int n = state.replicas->size();
    stagers_.clear();
    for (int r = 0; r < n; ++r) {
      const Device d = state.replicas->device(r);
      stagers_.push_back(d.is_cuda() ? std::make_unique<BatchStager>(d) : nullptr);
    }
    split_ = std::make_unique<function_node<Message, Message>>(
        g, serial, [this, n, &state](const Message& m) {
          return Guarded([&] {
            m->replica_loss.assign(n, 0.0);
            m->replica_correct.assign(n, 0);
            m->staged.assign(n, nullptr);
            m->replica_pending.assign(n, nullptr);
            for (int r = 0; r < n; ++r) {
              const auto [b, e] = ReplicaRows(state, *m, r);
              if (stagers_[r] && e > b) {
                m->staged[r] = stagers_[r]->Stage(m->inputs.Slice(b, e), m->labels.data() + b);
              }
            }
            return m;
          });
        });
    StagePorts ports;
    ports.input = split_.get();
    state.lanes.release.assign(n, nullptr);
    for (int r = 0; r < n; ++r) {
      queues_.push_back(std::make_unique<queue_node<Message>>(g));
      gates_.push_back(std::make_unique<limiter_node<Message>>(g, 1));
      replicas_.push_back(std::make_unique<function_node<Message, Message>>(
          g, serial, [this, r, &state](const Message& m) {
            return Guarded([&] {
              if (r == 0) Tracer::AtStep(m->global_step);  // cnnflow train --trace: its window
              const TraceSpan span("step", [r] { return StrCat("replica ", r); });
              Run(state, r, *m);
              return m;
            });
          }));
      make_edge(*split_, *queues_.back());
      make_edge(*queues_.back(), *gates_.back());
      make_edge(*gates_.back(), *replicas_.back());
      state.lanes.release[r] = [gate = gates_.back().get()] {
        gate->decrementer().try_put(continue_msg());
      };
      ports.lane_outputs.push_back(replicas_.back().get());
    }
    return ports;
  }

 private:
  static void Run(RunState& s, int r, BatchMessage& m) {
    ReplicaSet& set = *s.replicas;
    const int64_t stop_after = s.stop_after_step.load();
    if (stop_after >= 0 && m.global_step > stop_after) {
      m.dropped = true;
      return;
    }
    if (r == 0) {  // CNNFLOW_TEST_FAULT and CNNFLOW_TEST_SLOW_START, for the fault tests
      MaybeInjectTestFault(m.global_step);
      MaybeSlowTestStart(m.global_step);
    }
    const auto [b, e] = ReplicaRows(s, m, r);
    // The gradient of the mean loss over the window's batches of all
    // replicas of all processes (the global batch's rows, however they fall
    // on the processes); buckets are summed. The members of a
    // tensor-parallel group train on the same rows: each takes 1/T (its
    // split layers scale their own parts back, ops/parallel/tensor_parallel.h).
    const int64_t global = GlobalRows(s, m);
    const double scale = global > 0 ? 1.0 / (static_cast<double>(global) * set.tensor_parallel() *
                                             static_cast<double>(s.plan.WindowBatches(m.index)))
                                    : 0.0;
    ForwardContext ctx;
    ctx.training = true;
    ctx.seed = s.seed;
    ctx.step = m.micro_step;
    ctx.sample_ids = m.sample_ids.data() + b;
    LabelMix mix;
    if (!m.mix_labels.empty()) {
      mix.other = m.mix_labels.data() + b;
      mix.weight = m.mix_weights.data() + b;
    }
    std::shared_ptr<BatchStager::Staged> staged = std::move(m.staged[r]);
    if (staged) staged->WaitForCopy();
    const ReplicaSet::Result res = set.ForwardBackward(
        r, staged ? staged->inputs() : m.inputs.Slice(b, e), m.labels.data() + b, ctx, scale,
        s.label_smoothing, s.plan.EndsWindow(m.index), staged ? staged->labels() : nullptr,
        m.mix_labels.empty() ? nullptr : &mix);
    if (staged) staged->Release();  // every kernel that reads the rows is issued
    // A group's rows count once, from its member 0.
    const bool counts = set.tensor_parallel_member(r) == 0;
    m.replica_loss[r] = counts ? res.loss_sum : 0;
    m.replica_correct[r] = counts ? res.correct : 0;
    m.replica_pending[r] = res.pending;
  }

  std::vector<std::unique_ptr<BatchStager>> stagers_;  // per replica; null on a CPU
  std::unique_ptr<tbb::flow::function_node<Message, Message>> split_;
  std::vector<std::unique_ptr<tbb::flow::queue_node<Message>>> queues_;
  std::vector<std::unique_ptr<tbb::flow::limiter_node<Message>>> gates_;
  std::vector<std::unique_ptr<tbb::flow::function_node<Message, Message>>> replicas_;
};

}  // namespace

CNNFLOW_REGISTER_PER_DEVICE_STAGE(
    forward_backward, ForwardBackwardStage,
    Schema("One node per device of graph.devices: forward, loss and backward of that replica on "
           "its shard of the batch; at the end of an accumulation window its gradient buckets are "
           "all-reduced while backward goes on. A replica's next batch enters once the optimizer "
           "is done with its previous one."),
    kPerDevice);

// It trains, and waits for an optimizer after it to admit a replica's next batch.
CNNFLOW_STAGE_PLAN(forward_backward, [](const Args&, const PlanNode& node, GraphPlan& plan) {
  plan.training_nodes.insert(node.name);
  plan.waits_for_optimizer.push_back(node.name);
});

}  // namespace cnnflow
