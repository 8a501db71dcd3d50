// pipeline_stage: the model's pipeline stages (graph.pipeline,
// ops/parallel/pipeline_model.h), one node per device of graph.devices, a lane each:
//
//   gate -> split -> stage 0 <-> stage 1 <-> ... <-> stage S-1
//
// gate:    one batch at a time in the pipeline: the next enters once every
//          stage's lane has left the graph's lanes (its optimizer step is
//          done, PassState::lanes);
// split:   cuts the batch into micro-batches and tells every stage;
// stage s: runs its actions in the schedule's order (gpipe | 1f1b), each as
//          soon as its input has come: forward of micro-batch i after the
//          message "activations of i" from stage s-1, backward of i after
//          "gradients of i" from stage s+1. After each action it sends
//          that message on. After its last, under MPI, it starts summing its
//          gradients over the processes (the allreduce stage waits for it),
//          and emits the batch on lane s.
// The messages only say which micro-batch is ready; the tensors stay in the
// PipelineModel, which every stage shares.
#include <tbb/flow_graph.h>

#include <atomic>

#include "ops/collectives/collective_mpi.h"
#include "ops/parallel/pipeline_model.h"
#include "ops/trace.h"
#include "stages/pass_state.h"
#include "stages/run_context.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

// What flows between the stage nodes: micro-batch i of a batch is ready for
// the receiving stage (kBegin: the batch has entered the pipeline).
struct StageMessage {
  enum Kind { kBegin, kActivations, kGradients } kind = kBegin;
  int64_t serial = 0;  // the batch's number in this graph
  int microbatch = 0;
  Message batch;
};

// One stage's progress through its actions of the batch in the pipeline.
struct StageCursor {
  int64_t serial = -1;
  std::vector<PipelineAction> plan;
  size_t next = 0;
  bool done = false;                      // emitted on the lane
  std::vector<char> inputs_in, grads_in;  // by micro-batch: what has come
};

class PipelineStageStage final : public Stage {
 public:
  PipelineStageStage(const StageInfo& info, const Args&) : Stage(info) {}

  StagePorts Build(FlowGraph& g, const RunContext& run, PassState& pass) override {
    using namespace tbb::flow;
    CNNFLOW_ENFORCE(run.pipeline != nullptr,
                    "pipeline_stage needs graph.pipeline in the config (the model's stages)");
    PipelineModel& p = *run.pipeline;
    const int n = p.num_stages();
    queue_ = std::make_unique<queue_node<Message>>(g);
    gate_ = std::make_unique<limiter_node<Message>>(g, 1);
    split_ = std::make_unique<SplitNode>(g, serial, [this, &run](const Message& m, auto& out) {
      Guarded([&] { Begin(run, *m); });
      // One message for all stages (port 0 goes to each).
      std::get<0>(out).try_put(StageMessage{StageMessage::kBegin, ++serial_, 0, m});
    });
    make_edge(*queue_, *gate_);
    make_edge(*gate_, *split_);
    cursors_.assign(n, StageCursor());
    released_ = 0;
    pass.lanes.release.assign(n, [this, n] {
      if (++released_ < n) return;
      released_ = 0;
      gate_->decrementer().try_put(continue_msg());
    });
    StagePorts ports;
    ports.input = queue_.get();
    for (int s = 0; s < n; ++s) {
      stages_.push_back(std::make_unique<StageNode>(
          g, serial, [this, s, &run, &pass](const StageMessage& msg, auto& out) {
            Guarded([&] { Run(run, pass, s, msg, out); });
          }));
      ports.lane_outputs.push_back(&output_port<2>(*stages_.back()));
    }
    // The split tells every stage: its port 0 is a broadcast to all.
    for (int s = 0; s < n; ++s) {
      make_edge(output_port<0>(*split_), *stages_[s]);
      if (s + 1 < n) make_edge(output_port<0>(*stages_[s]), *stages_[s + 1]);
      if (s > 0) make_edge(output_port<1>(*stages_[s]), *stages_[s - 1]);
    }
    return ports;
  }

 private:
  using SplitNode = tbb::flow::multifunction_node<Message, std::tuple<StageMessage>>;
  // Ports: 0 to the next stage, 1 to the previous one, 2 the lane.
  using StageNode =
      tbb::flow::multifunction_node<StageMessage, std::tuple<StageMessage, StageMessage, Message>>;

  void Begin(const RunContext& s, BatchMessage& m) {
    const int64_t stop_after = s.control->stop_after_step.load();
    const int n = s.pipeline->num_stages();
    if (stop_after >= 0 && m.global_step > stop_after) {  // every process stopped before it
      m.dropped = true;
      return;
    }
    const auto rows = static_cast<int64_t>(m.labels.size());
    microbatches_ = 0;
    if (rows == 0) {
      // No rows here (a short last batch's empty part): the other processes
      // still sum gradients with this one's, zero, in the stages' order.
      if (s.process_count > 1)
        for (int st = n - 1; st >= 0; --st) s.pipeline->StartGradientSum(st, MpiWorld::Get());
      return;
    }
    Tracer::AtStep(m.global_step);  // cnnflow train --trace: its window
    ForwardContext ctx;
    ctx.seed = s.seed;
    ctx.step = m.micro_step;
    ctx.sample_ids = m.sample_ids.data();
    const double scale = 1.0 / static_cast<double>(GlobalRows(s, m));
    microbatches_ = s.pipeline->BeginStep(m.inputs, m.labels.data(), ctx, scale, s.label_smoothing);
  }

  template <typename Out>
  void Run(const RunContext& run, PassState& pass, int s, const StageMessage& msg, Out& out) {
    PipelineModel& p = *run.pipeline;
    const int n = p.num_stages();
    StageCursor& c = cursors_[s];
    BatchMessage& m = *msg.batch;
    if (c.serial != msg.serial) {  // the batch's first message here (its begin, or an input)
      const int micro = m.dropped ? 0 : microbatches_;
      c.serial = msg.serial;
      c.plan = StageSchedule(p.options().schedule, s, n, micro);
      c.next = 0;
      c.done = false;
      c.inputs_in.assign(micro, s == 0);     // stage 0's inputs are the batch's rows
      c.grads_in.assign(micro, s + 1 == n);  // the last stage's come from its loss
    }
    if (c.done) return;  // a begin after the batch's inputs
    if (msg.kind == StageMessage::kActivations) c.inputs_in[msg.microbatch] = 1;
    if (msg.kind == StageMessage::kGradients) c.grads_in[msg.microbatch] = 1;
    while (c.next < c.plan.size()) {
      const PipelineAction a = c.plan[c.next];
      if (!(a.forward ? c.inputs_in : c.grads_in)[a.microbatch]) return;  // its input is to come
      ++c.next;
      const bool last = c.next == c.plan.size();
      if (a.forward) {
        {
          const TraceSpan span("step",
                               [s, &a] { return StrCat("stage ", s, " forward ", a.microbatch); });
          p.Forward(s, a.microbatch);
        }
        if (s + 1 < n) {
          std::get<0>(out).try_put(
              StageMessage{StageMessage::kActivations, msg.serial, a.microbatch, msg.batch});
        }
        continue;
      }
      {
        const TraceSpan span("step",
                             [s, &a] { return StrCat("stage ", s, " backward ", a.microbatch); });
        p.Backward(s, a.microbatch);
      }
      if (last) {
        // Started before the previous stage can finish, so every process
        // starts them in the same order (stage S-1 first).
        if (run.process_count > 1) p.StartGradientSum(s, MpiWorld::Get());
        if (s + 1 == n) {  // the batch's loss, for the lanes' gather
          const PipelineModel::Result r = p.StepResult();
          pass.lanes.results.Put(m.index, s, n, {r.loss_sum, r.correct, r.pending});
        }
      }
      if (s > 0) {
        std::get<1>(out).try_put(
            StageMessage{StageMessage::kGradients, msg.serial, a.microbatch, msg.batch});
      }
    }
    c.done = true;
    std::get<2>(out).try_put(msg.batch);
  }

  int64_t serial_ = 0;                // batches that entered the pipeline
  int microbatches_ = 0;              // of the batch in the pipeline (0: nothing to do)
  std::vector<StageCursor> cursors_;  // by stage; each touched by its node only
  std::atomic<int> released_{0};      // lanes done with the batch in the pipeline
  std::unique_ptr<tbb::flow::queue_node<Message>> queue_;
  std::unique_ptr<tbb::flow::limiter_node<Message>> gate_;
  std::unique_ptr<SplitNode> split_;
  std::vector<std::unique_ptr<StageNode>> stages_;
};

}  // namespace

CNNFLOW_REGISTER_PER_DEVICE_STAGE(
    pipeline_stage, PipelineStageStage,
    Schema("One node per pipeline stage (graph.pipeline: a device each): runs that stage's "
           "forwards and backwards of the batch's micro-batches in the schedule's order (gpipe or "
           "1f1b), each when the activations or gradients of its micro-batch arrive from the "
           "neighbouring stage. A batch enters once every stage's optimizer is done with the "
           "previous one."),
    kPerDeviceChain);

// It trains, and waits for the optimizers after it to admit the next batch.
CNNFLOW_STAGE_PLAN(pipeline_stage, [](const Args&, const PlanNode& node, GraphPlan& plan) {
  plan.training_nodes.insert(node.name);
  plan.waits_for_optimizer.push_back(node.name);
});

}  // namespace cnnflow
