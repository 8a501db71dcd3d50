// ema: one node per device (a lane each), after optimizer: after each
// optimizer step, replica 0's node folds the stepped weights into an
// exponential moving average (ops/train/weight_average.h; the replicas hold the
// same weights). In the lane, before the gather lets the replica's next
// batch in, so no step can change the weights under it. The average is the
// trainer's (RunContext::ema): it lives across epochs, goes into every
// checkpoint (a resumed run continues it bitwise) and into model.safetensors
// as "ema.<layer>.<tensor>", and with `eval: true` each evaluation runs on it.
//
// With `lookahead: true` each update is copied back into the weights (the
// CIFAR speed runs' lookahead): every replica's lane then updates an average
// of its own (they hold the same weights, so the same average; replica 0's
// is the trainer's, the others copies of it made when the pass starts) and
// copies it into its replica.
#include <tbb/flow_graph.h>

#include <memory>
#include <vector>

#include "ops/device.h"
#include "ops/train/weight_average.h"
#include "stages/lanes.h"
#include "stages/pass_state.h"
#include "stages/run_context.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

class EmaStage final : public Stage {
 public:
  EmaStage(const StageInfo& info, const Args& args)
      : Stage(info), lookahead_(args.Bool("lookahead")) {}

  StagePorts Build(FlowGraph& g, const RunContext& run, PassState& pass) override {
    CNNFLOW_ENFORCE(run.replicas != nullptr && run.ema != nullptr,
                    "ema needs data-parallel replicas (not a pipeline)");
    const int n = run.replicas->size();
    copies_.clear();
    copies_.resize(n);
    if (lookahead_) {
      for (int r = 1; r < n; ++r) {
        const GpuLaneScope lane(run.replicas->lane(r));  // replica r's GPU lane (ops/device.h)
        copies_[r] = run.ema->CopyFor(run.replicas->model(r));
      }
    }
    StagePorts ports;
    lanes_ = std::make_unique<LaneNodes>(
        g, run, pass, n,
        [this, &run, &pass](int r, BatchMessage& m) {
          Guarded([&] {
            if (m.dropped || !pass.plan.EndsWindow(m.index) || (r != 0 && !lookahead_)) return;
            const GpuLaneScope lane(run.replicas->lane(r));
            Model& model = run.replicas->model(r);
            WeightAverage& average = r == 0 ? *run.ema : *copies_[r];
            if (average.UpdateAfter(model, m.global_step + 1) && lookahead_) {
              average.CopyTo(model);
            }
          });
        },
        ports);
    return ports;
  }

 private:
  bool lookahead_;
  std::vector<std::unique_ptr<WeightAverage>> copies_;  // replicas 1.. with lookahead
  std::unique_ptr<LaneNodes> lanes_;                    // ending in their gather
};

}  // namespace

CNNFLOW_REGISTER_PER_DEVICE_STAGE(
    ema, EmaStage,
    Schema("One node per device, after optimizer: an exponential moving average of the weights "
           "(parameters and BN statistics), average = d * average + (1 - d) * weights after "
           "each optimizer step; in checkpoints and in model.safetensors as "
           "\"ema.<layer>.<tensor>\".")
        .Optional("decay", ParamType::kFloat, 0.999, "the average's decay per optimizer step")
        .Optional("warmup", ParamType::kBool, true,
                  "decay min(decay, (1 + t) / (10 + t)) at the t-th step, as timm's")
        .Optional("eval", ParamType::kBool, true,
                  "evaluate on the averaged weights (else on the trained ones)")
        .Optional("every", ParamType::kInt, int64_t{1}, "update after every k-th optimizer step")
        .Optional("start_epoch", ParamType::kFloat, 0.0,
                  "no update before this epoch (fractions allowed)")
        .Optional("ramp", ParamType::kFloat, 0.0,
                  "> 0: the decay times (step / the run's steps)^ramp, rising from 0")
        .Optional("lookahead", ParamType::kBool, false,
                  "copy each update back into the weights (lookahead), and the average into "
                  "the weights at the end of the run"),
    kPerDevice);

// The trainer keeps the average (in checkpoints, evaluated on): one per graph.
CNNFLOW_STAGE_PLAN(ema, [](const Args& a, const PlanNode& node, GraphPlan& plan) {
  if (plan.weight_average) {
    throw ConfigError(
        StrCat(node.where, ": a second ema node (the first is '", plan.weight_average->node, "')"));
  }
  plan.training_nodes.insert(node.name);
  plan.weight_average = GraphPlan::WeightAveragePlan{
      node.name,          node.where,     a.Float("decay"),       a.Bool("warmup"),
      a.Bool("eval"),     a.Int("every"), a.Float("start_epoch"), a.Float("ramp"),
      a.Bool("lookahead")};
});

}  // namespace cnnflow
