// allreduce: one node per device (a lane each), after forward_backward. At
// the last micro-batch of an accumulation window it waits until replica r's
// gradient buckets are summed over every replica of every process, and its
// BN buffers broadcast: through whatever Collective the replicas have (the
// in-process group, MPI across processes, NCCL among GPUs;
// ops/collectives/collective.h). Backward started each bucket's reduction the moment it
// was filled, so most of that work overlapped backward; what is left is
// this node's wait ("allreduce-wait" in --trace). A collective that misses
// its deadline fails the run here, naming the bucket.
//
// After pipeline_stage, lane s waits for pipeline stage s's gradients to be
// summed over the processes of an MPI job (each holds a replica of the
// pipeline); in one process there is nothing to wait for.
#include <tbb/flow_graph.h>

#include "ops/collectives/collective_mpi.h"
#include "ops/trace.h"
#include "stages/lanes.h"
#include "stages/pass_state.h"
#include "stages/run_context.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

class AllReduceStage final : public Stage {
 public:
  AllReduceStage(const StageInfo& info, const Args&) : Stage(info) {}

  StagePorts Build(FlowGraph& g, const RunContext& run, PassState& pass) override {
    StagePorts ports;
    if (run.pipeline != nullptr) {
      lanes_ = std::make_unique<LaneNodes>(
          g, run.pipeline->num_stages(),
          [this, &run](int s, BatchMessage& m) {
            Guarded([&] {
              if (m.dropped || run.process_count == 1) return;
              const TraceSpan span("allreduce-wait", "wait for gradient sums");
              run.pipeline->FinishGradientSum(s, MpiWorld::Get(), run.collective_timeout_s);
            });
          },
          ports);
      return ports;
    }
    CNNFLOW_ENFORCE(run.replicas != nullptr, "allreduce needs replicas or a pipeline");
    lanes_ = std::make_unique<LaneNodes>(
        g, run.replicas->size(),
        [this, &run, &pass](int r, BatchMessage& m) {
          Guarded([&] {
            if (!m.dropped && pass.plan.EndsWindow(m.index)) run.replicas->WaitForReductions(r);
          });
        },
        ports);
    return ports;
  }

 private:
  std::unique_ptr<LaneNodes> lanes_;
};

}  // namespace

CNNFLOW_REGISTER_PER_DEVICE_STAGE(
    allreduce, AllReduceStage,
    Schema("One node per device: at the end of an accumulation window, waits until that "
           "replica's gradient buckets (started as backward filled them) are summed over every "
           "replica of every process, in-process, over MPI or NCCL, and its BN buffers "
           "broadcast. After pipeline_stage: waits for that stage's gradients to be summed over "
           "the processes of an MPI job."),
    kPerDevice);

CNNFLOW_STAGE_PLAN(allreduce, [](const Args&, const PlanNode& node, GraphPlan& plan) {
  plan.training_nodes.insert(node.name);
});

}  // namespace cnnflow
