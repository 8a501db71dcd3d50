// The device lanes of a train graph (see StagePorts): their nodes, and
// their end.
//
// LaneGather: once every replica is done with a batch, sums the loss and
// the correct count the lanes left (PassState::lanes), advances the run's
// position, and passes the batch on. Each lane's message also lets that
// replica's next batch into forward_backward: nothing after this point
// touches its parameters. A per-device stage that may end the lanes
// (optimizer, ema) offers one as StagePorts::gather_inputs and ::output;
// the executor wires the stage's lanes into it unless they go on to another
// per-device stage.
#pragma once

#include <tbb/flow_graph.h>

#include <map>
#include <memory>
#include <vector>

#include "ops/parallel/data_parallel.h"
#include "stages/pass_state.h"
#include "stages/run_context.h"
#include "stages/stage.h"

namespace cnnflow {

class LaneGather {
 public:
  LaneGather(tbb::flow::graph& g, const RunContext& run, PassState& pass, int lanes)
      : node_(g, tbb::flow::serial, [this, &run, &pass, lanes](const LaneMessage& m, auto& out) {
          // The replica is done with the batch: its next one may start.
          CNNFLOW_ENFORCE(m.lane < static_cast<int>(pass.lanes.release.size()),
                          "no forward_backward or pipeline_stage node feeds these lanes");
          if (m.lane == 0 && run.replicas != nullptr && !run.replicas->device(0).is_cuda()) {
            // Read before the release: then replica 0 is between batches.
            const ReplicaSet::Counters& c = run.replicas->counters(0);
            m.batch->step_busy_seconds = c.compute_seconds() + c.reduce_wait_seconds;
            m.batch->step_reduce_wait_seconds = c.reduce_wait_seconds;
          }
          pass.lanes.release[m.lane]();
          if (++arrived_[m.batch->index] < lanes) return;
          arrived_.erase(m.batch->index);
          Gather(run, pass, lanes, *m.batch);
          std::get<0>(out).try_put(m.batch);
        }) {
    for (int r = 0; r < lanes; ++r) {
      tags_.push_back(std::make_unique<tbb::flow::function_node<Message, LaneMessage>>(
          g, tbb::flow::serial, [r](const Message& m) {
            return LaneMessage{r, m};
          }));
      tbb::flow::make_edge(*tags_.back(), node_);
    }
  }

  // Its ports as a stage's lane-ending ports: gather_inputs (lane r's way
  // in) and output (the gathered batches).
  void AddTo(StagePorts& ports) {
    for (auto& t : tags_) ports.gather_inputs.push_back(t.get());
    ports.output = &tbb::flow::output_port<0>(node_);
  }

 private:
  struct LaneMessage {
    int lane;
    Message batch;
  };

  static void Gather(const RunContext& run, PassState& pass, int n, BatchMessage& m) {
    const int64_t rows = static_cast<int64_t>(m.labels.size());
    double loss = 0;
    m.correct = 0;
    std::vector<LaneResult> results = pass.lanes.results.TakeAll(m.index, n);
    for (int r = 0; r < n; ++r) {
      LaneResult& lane = results[r];
      // GPU losses are read here, off the replicas' threads, so the
      // replicas go on issuing the next batch meanwhile.
      if (lane.pending) {
        const LossResult lr = lane.pending->Get();
        CheckLossFinite(lr.loss, m.global_step);
        // A pipeline's last stage has the batch's every row.
        const auto [b, e] =
            run.replicas ? ReplicaRows(run, m, r) : std::pair<int64_t, int64_t>{0, rows};
        lane.loss_sum = lr.loss * static_cast<double>(e - b);
        lane.correct = lr.correct;
      }
      loss += lane.loss_sum;
      m.correct += lane.correct;
    }
    m.loss = rows == 0 ? 0 : loss / static_cast<double>(rows);
    if (m.dropped) {  // counts nowhere: the run stopped before it
      m.labels.clear();
      m.correct = 0;
    } else {
      pass.batches_done = pass.plan.MicroStep(m.index) + 1;
      if (pass.plan.EndsWindow(m.index)) pass.global_step = pass.plan.GlobalStep(m.index) + 1;
    }
  }

  tbb::flow::multifunction_node<LaneMessage, std::tuple<Message>> node_;
  std::vector<std::unique_ptr<tbb::flow::function_node<Message, LaneMessage>>> tags_;
  std::map<int64_t, int> arrived_;  // replicas done, by batch index
};

// One serial node per lane, lane r running body(r, message) on each batch,
// as lanes in and out of `ports` (the per-device stages' shape); given the
// run and the pass, their LaneGather too, for a stage that may end the lanes.
class LaneNodes {
 public:
  template <typename Body>
  LaneNodes(tbb::flow::graph& g, int lanes, Body body, StagePorts& ports) {
    for (int r = 0; r < lanes; ++r) {
      nodes_.push_back(std::make_unique<tbb::flow::function_node<Message, Message>>(
          g, tbb::flow::serial, [r, body](const Message& m) {
            body(r, *m);
            return m;
          }));
      ports.lane_inputs.push_back(nodes_.back().get());
      ports.lane_outputs.push_back(nodes_.back().get());
    }
  }
  template <typename Body>
  LaneNodes(tbb::flow::graph& g, const RunContext& run, PassState& pass, int lanes, Body body,
            StagePorts& ports)
      : LaneNodes(g, lanes, std::move(body), ports) {
    gather_ = std::make_unique<LaneGather>(g, run, pass, lanes);
    gather_->AddTo(ports);
  }

 private:
  std::vector<std::unique_ptr<tbb::flow::function_node<Message, Message>>> nodes_;
  std::unique_ptr<LaneGather> gather_;
};

}  // namespace cnnflow
