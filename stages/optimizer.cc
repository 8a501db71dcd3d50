// optimizer: one node per device (a lane each), after allreduce, then a
// gather:
//
//   replica 0 .. N-1 -> gather
//
// replica: at the last micro-batch of an accumulation window, steps replica
//          r's optimizer with the reduced gradients (the learning rate of the
//          schedule at this step; the f16 loss scaler may skip it). Under
//          MPI all processes then agree whether any was asked to stop, so
//          that all stop after the same step. Then lets replica r's next
//          batch into forward_backward (RunState::lanes);
// gather:  once every replica is done with a batch, sums the loss and the
//          correct count and passes the batch on.
#include <tbb/flow_graph.h>

#include <map>

#include "ops/data_parallel.h"
#include "stages/run_state.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

class OptimizerStage final : public Stage {
 public:
  OptimizerStage(const StageInfo& info, const Args&) : Stage(info) {}

  StagePorts Build(FlowGraph& g, RunState& state) override {
    using namespace tbb::flow;
    CNNFLOW_ENFORCE(state.replicas != nullptr && state.schedule != nullptr,
                    "optimizer needs replicas and a schedule");
    const int n = state.replicas->size();
    gather_ = std::make_unique<multifunction_node<Message, std::tuple<Message>>>(
        g, serial, [this, n, &state](const Message& m, auto& out) {
          Guarded([&] {
            if (++arrived_[m->index] < n) return;
            arrived_.erase(m->index);
            Gather(state, n, *m);
            std::get<0>(out).try_put(m);
          });
        });
    StagePorts ports;
    for (int r = 0; r < n; ++r) {
      lanes_.push_back(std::make_unique<function_node<Message, Message>>(
          g, serial, [this, r, &state](const Message& m) {
            return Guarded([&] {
              if (!m->dropped && state.EndsWindow(*m)) Step(state, r, *m);
              CNNFLOW_ENFORCE(r < static_cast<int>(state.lanes.release.size()),
                              "no forward_backward node feeds this optimizer");
              state.lanes.release[r]();
              return m;
            });
          }));
      make_edge(*lanes_.back(), *gather_);
      ports.lane_inputs.push_back(lanes_.back().get());
    }
    ports.output = &output_port<0>(*gather_);
    return ports;
  }

 private:
  static void Step(RunState& s, int r, BatchMessage& m) {
    ReplicaSet& set = *s.replicas;
    m.lr = s.schedule->At(m.global_step);
    set.Step(r, m.lr);
    // Under MPI a signal may reach some processes only, or at different
    // steps: they agree after each step, so that all stop after the same
    // one (else their collectives would no longer match).
    if (s.process_count > 1 && set.AgreeStop(r, s.stop_requested.load())) {
      s.stop_after_step = m.global_step;
      s.stop_requested = true;
    }
  }

  // The batch's loss and correct count over the replicas, and the run's
  // position after it.
  static void Gather(RunState& state, int n, BatchMessage& m) {
    const int64_t rows = static_cast<int64_t>(m.labels.size());
    // GPU losses are read here, off the replicas' threads, so the replicas
    // go on issuing the next batch meanwhile.
    for (int r = 0; r < n; ++r) {
      if (!m.replica_pending[r]) continue;
      const LossResult lr = m.replica_pending[r]->Get();
      m.replica_pending[r].reset();
      CheckLossFinite(lr.loss, m.global_step);
      const auto [b, e] = ShardRows(rows, r, n);
      m.replica_loss[r] = lr.loss * static_cast<double>(e - b);
      m.replica_correct[r] = lr.correct;
    }
    double loss = 0;
    m.correct = 0;
    for (int r = 0; r < n; ++r) {
      loss += m.replica_loss[r];
      m.correct += m.replica_correct[r];
    }
    m.loss = rows == 0 ? 0 : loss / static_cast<double>(rows);
    if (m.dropped) {  // counts nowhere: the run stopped before it
      m.labels.clear();
      m.correct = 0;
    } else {
      state.batches_done = m.micro_step + 1;
      if (state.EndsWindow(m)) state.global_step = m.global_step + 1;
    }
  }

  std::vector<std::unique_ptr<tbb::flow::function_node<Message, Message>>> lanes_;
  std::unique_ptr<tbb::flow::multifunction_node<Message, std::tuple<Message>>> gather_;
  std::map<int64_t, int> arrived_;  // replicas done, by batch index
};

}  // namespace

CNNFLOW_REGISTER_PER_DEVICE_STAGE(
    optimizer, OptimizerStage,
    Schema("One node per device, then a gather: at the end of an accumulation window, steps that "
           "replica's optimizer with the reduced gradients (train.lr schedule, accumulation, f16 "
           "loss-scale skips); then sums the batch's loss and accuracy over the replicas."));

}  // namespace cnnflow
