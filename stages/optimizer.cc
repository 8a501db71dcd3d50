// optimizer: one node per device (a lane each), after allreduce. At the
// last micro-batch of an accumulation window, steps replica r's optimizer
// with the reduced gradients (the learning rate of the schedule at this
// step; the f16 loss scaler may skip it). Under MPI all processes then
// agree whether any was asked to stop, so that all stop after the same
// step. After pipeline_stage, lane s steps pipeline stage s's optimizer.
// Its lanes go on to per-device stages that read the stepped weights
// (ema), or end here in a gather (stages/lanes.h) that sums the
// batch's loss and accuracy over the replicas.
#include <tbb/flow_graph.h>

#include "ops/collectives/collective_mpi.h"
#include "ops/parallel/data_parallel.h"
#include "ops/trace.h"
#include "stages/lanes.h"
#include "stages/pass_state.h"
#include "stages/run_context.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

class OptimizerStage final : public Stage {
 public:
  OptimizerStage(const StageInfo& info, const Args&) : Stage(info) {}

  StagePorts Build(FlowGraph& g, const RunContext& run, PassState& pass) override {
    CNNFLOW_ENFORCE((run.replicas != nullptr || run.pipeline != nullptr) && run.schedule != nullptr,
                    "optimizer needs replicas or a pipeline, and a schedule");
    const int n = run.pipeline ? run.pipeline->num_stages() : run.replicas->size();
    StagePorts ports;
    lanes_ = std::make_unique<LaneNodes>(
        g, run, pass, n,
        [this, &run, &pass](int r, BatchMessage& m) {
          Guarded([&] {
            if (m.dropped || !pass.plan.EndsWindow(m.index)) return;
            if (run.pipeline) {
              StepPipeline(run, r, m);
            } else {
              Step(run, r, m);
            }
          });
        },
        ports);
    return ports;
  }

 private:
  static void Step(const RunContext& s, int r, BatchMessage& m) {
    ReplicaSet& set = *s.replicas;
    const double lr = s.schedule->At(m.global_step);
    if (r == 0) m.lr = lr;  // the lanes run at once
    set.Step(r, lr);
    // A stop request (Ctrl-C, SIGTERM) ends the run after this step: the
    // batches already sampled past it (up to the prefetch depth) are
    // dropped, not trained, else a stop would take that many more steps.
    // Under MPI a signal may reach some processes only, or at different
    // steps: they agree after each step, so that all stop after the same
    // one (else their collectives would no longer match); a process's
    // replicas agree the same way (no collective for one replica).
    if (set.AgreeStop(r, m.global_step, s.control->stop_requested.load())) StopAfter(*s.control, m);
    StartupDone();
  }

  // The stop agreement is the step's last collective: once it is done,
  // every process has finished its first step, and the rest of the run's
  // collectives wait graph.collective_timeout_s instead of the start-up
  // deadline (MpiWorld::BeginStartup, begun by the trainer).
  static void StartupDone() { MpiWorld::EndStartup(); }

  // Every process agreed to stop: after this step.
  static void StopAfter(RunControl& control, const BatchMessage& m) {
    control.stop_after_step = m.global_step;
    control.stop_requested = true;
  }

  static void StepPipeline(const RunContext& s, int stage, BatchMessage& m) {
    // A process with no rows (a short last batch's empty part) steps with
    // the others' summed gradients all the same.
    if (m.labels.empty() && s.process_count == 1) return;
    const double lr = s.schedule->At(m.global_step);
    {
      const TraceSpan span("optimizer",
                           [stage] { return StrCat("stage ", stage, " optimizer step"); });
      s.pipeline->Step(stage, lr);
    }
    if (stage != 0) return;
    m.lr = lr;
    // The stop agreement, as above, once per step: after stage 0's gradient
    // sum, the last collective of the step on every process.
    if (s.process_count > 1) {
      float stop = s.control->stop_requested.load() ? 1.0f : 0.0f;
      MpiWorld::Get().AllReduceSum(&stop, 1, "stop request", s.collective_timeout_s);
      if (stop > 0) StopAfter(*s.control, m);
    }
    StartupDone();
  }

  std::unique_ptr<LaneNodes> lanes_;  // ending in their gather
};

}  // namespace

CNNFLOW_REGISTER_PER_DEVICE_STAGE(
    optimizer, OptimizerStage,
    Schema("One node per device: at the end of an accumulation window, steps that replica's "
           "optimizer with the reduced gradients (train.lr schedule, accumulation, f16 loss-scale "
           "skips); after pipeline_stage, that stage's optimizer. Its lanes end in a gather that "
           "sums the batch's loss and accuracy over the lanes, or go on to per-device stages that "
           "read the stepped weights (ema)."),
    kPerDevice);

CNNFLOW_STAGE_PLAN(optimizer, [](const Args&, const PlanNode& node, GraphPlan& plan) {
  plan.training_nodes.insert(node.name);
  plan.optimizer_nodes.insert(node.name);
});

}  // namespace cnnflow
