// pipeline_step: one optimizer step per batch through the model's pipeline
// stages (ops/pipeline_model.h). The batch is cut into micro-batches; every
// action of the schedule -- forward or backward of micro-batch i on stage s
// -- is a node of a dependency graph:
//
//   F(s, i) after F(s - 1, i)     activations flow forward
//   B(s, i) after B(s + 1, i)     gradients flow backward
//   each stage's actions chained in the schedule's order (gpipe | 1f1b)
//
// so stages run at once on their own thread shares wherever the schedule
// allows, and the graph (built once per micro-batch count) is reused for
// every batch.
#include <tbb/flow_graph.h>

#include <map>

#include "ops/collective_mpi.h"
#include "ops/pipeline_model.h"
#include "ops/trace.h"
#include "stages/run_state.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

// The actions of one step with `m` micro-batches, as a reusable graph.
class ActionGraph {
 public:
  ActionGraph(PipelineModel& p, int m) {
    using namespace tbb::flow;
    const int s_count = p.num_stages();
    std::vector<std::map<std::pair<bool, int>, continue_node<continue_msg>*>> at(s_count);
    start_ = std::make_unique<broadcast_node<continue_msg>>(g_);
    for (int s = 0; s < s_count; ++s) {
      continue_node<continue_msg>* prev = nullptr;
      for (const PipelineAction& a : StageSchedule(p.options().schedule, s, s_count, m)) {
        nodes_.push_back(std::make_unique<continue_node<continue_msg>>(
            g_, [&p, s, a](const continue_msg&) {
              if (a.forward) {
                p.Forward(s, a.microbatch);
              } else {
                p.Backward(s, a.microbatch);
              }
              return continue_msg();
            }));
        auto* node = nodes_.back().get();
        if (prev) make_edge(*prev, *node);
        prev = node;
        at[s][{a.forward, a.microbatch}] = node;
      }
    }
    for (int s = 0; s < s_count; ++s) {
      for (int i = 0; i < m; ++i) {
        if (s > 0) make_edge(*at[s - 1][{true, i}], *at[s][{true, i}]);
        if (s + 1 < s_count) make_edge(*at[s + 1][{false, i}], *at[s][{false, i}]);
      }
    }
    make_edge(*start_, *at[0][{true, 0}]);  // the one action with no inputs
  }

  void Run() {
    start_->try_put(tbb::flow::continue_msg());
    g_.wait_for_all();  // rethrows an action's exception
  }

 private:
  tbb::flow::graph g_;
  std::unique_ptr<tbb::flow::broadcast_node<tbb::flow::continue_msg>> start_;
  std::vector<std::unique_ptr<tbb::flow::continue_node<tbb::flow::continue_msg>>> nodes_;
};

class PipelineStepStage final : public Stage {
 public:
  PipelineStepStage(const StageInfo& info, const Args&) : Stage(info) {}

  StagePorts Build(FlowGraph& g, RunState& state) override {
    CNNFLOW_ENFORCE(state.pipeline && state.schedule,
                    "pipeline_step needs graph.pipeline in the config (the model's stages)");
    node_ = std::make_unique<tbb::flow::function_node<Message, Message>>(
        g, tbb::flow::serial, [this, &state](const Message& m) {
          return Guarded([&] {
            Tracer::AtStep(m->global_step);  // cnnflow train --trace: its window
            const TraceSpan span("step", "pipeline step");
            Step(state, *m);
            return m;
          });
        });
    return PortsOf(*node_);
  }

 private:
  void Step(RunState& s, BatchMessage& m) {
    PipelineModel& p = *s.pipeline;
    const int64_t stop_after = s.stop_after_step.load();
    if (stop_after >= 0 && m.global_step > stop_after) {  // every process stopped before it
      m.dropped = true;
      m.labels.clear();
      return;
    }
    const auto rows = static_cast<int64_t>(m.labels.size());
    if (rows > 0) {
      ForwardContext ctx;
      ctx.seed = s.seed;
      ctx.step = m.micro_step;
      ctx.sample_ids = m.sample_ids.data();
      const double scale = 1.0 / (static_cast<double>(rows) * s.process_count);
      const int micro = p.BeginStep(m.inputs, m.labels.data(), ctx, scale, s.label_smoothing);
      auto& graph = graphs_[micro];
      if (!graph) graph = std::make_unique<ActionGraph>(p, micro);
      graph->Run();
      m.lr = s.schedule->At(m.global_step);
      // In an MPI job each process is a data-parallel replica of the
      // pipeline: gradients are summed across them before the step.
      MpiWorld& world = MpiWorld::Get();
      std::function<void(float*, int64_t)> reduce;
      if (world.active()) {
        reduce = [&world, &s](float* data, int64_t count) {
          world.AllReduceSum(data, count, "pipeline gradients", s.collective_timeout_s);
        };
      }
      const TraceSpan step_span("optimizer", "pipeline reduce + optimizer step");
      const PipelineModel::Result r = p.EndStep(m.lr, reduce);
      m.loss = r.loss_sum / static_cast<double>(rows);
      m.correct = r.correct;
    }
    s.batches_done = m.micro_step + 1;
    s.global_step = m.global_step + 1;
    MpiWorld& world = MpiWorld::Get();
    if (world.active()) {  // all processes stop after the same step (see the optimizer stage)
      float stop = s.stop_requested.load() ? 1.0f : 0.0f;
      world.AllReduceSum(&stop, 1, "stop request", s.collective_timeout_s);
      if (stop > 0) {
        s.stop_after_step = m.global_step;
        s.stop_requested = true;
      }
    }
  }

  std::map<int, std::unique_ptr<ActionGraph>> graphs_;  // by micro-batch count
  std::unique_ptr<tbb::flow::function_node<Message, Message>> node_;
};

}  // namespace

CNNFLOW_REGISTER_STAGE(pipeline_step, PipelineStepStage,
                       Schema("One optimizer step per batch through the model's pipeline stages "
                              "(graph.pipeline): micro-batches, the gpipe or 1f1b schedule, "
                              "gradients added over the micro-batches."));

}  // namespace cnnflow
