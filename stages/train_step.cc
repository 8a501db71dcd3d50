// train_step: forward, loss, backward and optimizer steps of the run's
// replicas (ops/data_parallel.h). Inside, N + 2 oneTBB nodes:
//
//   split -> replica 0 .. replica N-1 -> gather
//
// split:   hands the batch to every replica (each takes its rows); for GPU
//          replicas it starts copying each replica's rows to its GPU
//          (ops/batch_stager.h), so that copy runs while the replica is
//          still computing the previous batch;
// replica: forward and backward of its shard in its own task arena; its
//          gradient buckets are all-reduced while backward goes on; at the
//          last micro-batch of an accumulation window, waits for the
//          reductions and steps its optimizer. Serial per replica: batch
//          k + 1 starts after batch k's step;
// gather:  once every replica is done with a batch, sums the loss and the
//          correct count and passes the batch on.
#include <tbb/flow_graph.h>

#include <map>

#include "ops/trace.h"
#include "stages/run_state.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

class TrainStepStage final : public Stage {
 public:
  TrainStepStage(const StageInfo& info, const Args&) : Stage(info) {}

  StagePorts Build(FlowGraph& g, RunState& state) override {
    using namespace tbb::flow;
    CNNFLOW_ENFORCE(state.replicas && state.schedule, "train_step needs replicas and a schedule");
    const int n = state.replicas->size();
    stagers_.clear();
    for (int r = 0; r < n; ++r) {
      const Device d = state.replicas->device(r);
      stagers_.push_back(d.is_cuda() ? std::make_unique<BatchStager>(d) : nullptr);
    }
    split_ = std::make_unique<function_node<Message, Message>>(g, serial, [this, n](const Message& m) {
      return Guarded([&] {
        m->replica_loss.assign(n, 0.0);
        m->replica_correct.assign(n, 0);
        m->staged.assign(n, nullptr);
        m->replica_pending.assign(n, nullptr);
        const int64_t rows = static_cast<int64_t>(m->labels.size());
        for (int r = 0; r < n; ++r) {
          const auto [b, e] = ShardRows(rows, r, n);
          if (stagers_[r] && e > b) {
            m->staged[r] = stagers_[r]->Stage(m->inputs.Slice(b, e), m->labels.data() + b);
          }
        }
        return m;
      });
    });
    gather_ = std::make_unique<multifunction_node<Message, std::tuple<Message>>>(
        g, serial, [this, n, &state](const Message& m, auto& out) {
          Guarded([&] {
            if (++arrived_[m->index] < n) return;
            arrived_.erase(m->index);
            // GPU losses are read here, off the replicas' threads, so the
            // replicas go on issuing the next batch meanwhile.
            for (int r = 0; r < n; ++r) {
              if (!m->replica_pending[r]) continue;
              const LossResult lr = m->replica_pending[r]->Get();
              m->replica_pending[r].reset();
              CheckLossFinite(lr.loss, m->global_step);
              const int64_t rows = static_cast<int64_t>(m->labels.size());
              const auto [b, e] = ShardRows(rows, r, n);
              m->replica_loss[r] = lr.loss * static_cast<double>(e - b);
              m->replica_correct[r] = lr.correct;
            }
            double loss = 0;
            m->correct = 0;
            for (int r = 0; r < n; ++r) {
              loss += m->replica_loss[r];
              m->correct += m->replica_correct[r];
            }
            m->loss = m->labels.empty() ? 0 : loss / static_cast<double>(m->labels.size());
            if (m->dropped) {  // counts nowhere: the run stopped before it
              m->labels.clear();
              m->correct = 0;
            } else {
              state.batches_done = m->micro_step + 1;
              if (EndsWindow(state, *m)) state.global_step = m->global_step + 1;
            }
            std::get<0>(out).try_put(m);
          });
        });
    for (int r = 0; r < n; ++r) {
      replicas_.push_back(std::make_unique<function_node<Message, Message>>(
          g, serial, [this, r, &state](const Message& m) {
            return Guarded([&] {
              if (r == 0) Tracer::AtStep(m->global_step);  // cnnflow train --trace: its window
              const TraceSpan span("step", [r] { return StrCat("replica ", r); });
              Step(state, r, *m);
              return m;
            });
          }));
      make_edge(*split_, *replicas_.back());
      make_edge(*replicas_.back(), *gather_);
    }
    StagePorts ports;
    ports.input = split_.get();
    ports.output = &output_port<0>(*gather_);
    return ports;
  }

 private:
  // Whether batch m is the last micro-batch of its accumulation window (or
  // of the pass).
  static bool EndsWindow(const RunState& s, const BatchMessage& m) {
    return (m.index + 1) % s.accumulate == 0 || m.index + 1 == s.pass_batches;
  }

  // Replica r's rows [b, e) of a batch of `rows` split over n replicas.
  static std::pair<int64_t, int64_t> ShardRows(int64_t rows, int r, int n) {
    return {rows * r / n, rows * (r + 1) / n};
  }

  static void Step(RunState& s, int r, BatchMessage& m) {
    ReplicaSet& set = *s.replicas;
    const int64_t stop_after = s.stop_after_step.load();
    if (stop_after >= 0 && m.global_step > stop_after) {
      m.dropped = true;
      return;
    }
    const int n = set.size();
    const int64_t rows = static_cast<int64_t>(m.labels.size());
    const auto [b, e] = ShardRows(rows, r, n);
    // The gradient of the mean loss over the window's batches of all
    // replicas of all processes; buckets are summed.
    const int64_t first = m.index - m.index % s.accumulate;
    const int64_t window = std::min(s.accumulate, s.pass_batches - first);
    const double global_rows = static_cast<double>(rows) * s.process_count;
    const double scale = rows > 0 ? 1.0 / (global_rows * static_cast<double>(window)) : 0.0;
    ForwardContext ctx;
    ctx.training = true;
    ctx.seed = s.seed;
    ctx.step = m.micro_step;
    ctx.sample_ids = m.sample_ids.data() + b;
    const bool reduce = EndsWindow(s, m);
    std::shared_ptr<BatchStager::Staged> staged = std::move(m.staged[r]);
    if (staged) staged->WaitForCopy();
    const ReplicaSet::Result res =
        set.ForwardBackward(r, staged ? staged->inputs() : m.inputs.Slice(b, e),
                            m.labels.data() + b, ctx, scale, s.label_smoothing, reduce,
                            staged ? staged->labels() : nullptr);
    if (staged) staged->Release();  // every kernel that reads the rows is issued
    m.replica_loss[r] = res.loss_sum;
    m.replica_correct[r] = res.correct;
    m.replica_pending[r] = res.pending;
    if (reduce) {
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
  }

  std::vector<std::unique_ptr<BatchStager>> stagers_;  // per replica; null on a CPU
  std::unique_ptr<tbb::flow::function_node<Message, Message>> split_;
  std::vector<std::unique_ptr<tbb::flow::function_node<Message, Message>>> replicas_;
  std::unique_ptr<tbb::flow::multifunction_node<Message, std::tuple<Message>>> gather_;
  std::map<int64_t, int> arrived_;  // replicas done, by batch index
};

}  // namespace

CNNFLOW_REGISTER_STAGE(train_step, TrainStepStage,
                       Schema("Forward, loss and backward of each replica on its shard of the "
                              "batch, gradient buckets all-reduced while backward goes on, then "
                              "one optimizer step per replica (every `train.accumulate` "
                              "batches)."));

}  // namespace cnnflow
