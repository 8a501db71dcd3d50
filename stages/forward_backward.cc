// forward_backward: each replica's forward, loss and backward on its rows
// of the batch (ops/parallel/data_parallel.h), one lane per device of graph.devices:
//
//   split -> queue r -> gate r -> replica r     (r = 0 .. N-1)
//
// split:   hands the batch to every lane; for GPU replicas it starts copying
//          each replica's rows, labels and mixed targets to its GPU
//          (ops/cuda/batch_stager.h), so that copy
//          runs while the replica is still computing the previous batch;
// gate r:  admits replica r's next batch once the optimizer stage is done
//          with its previous one (PassState::lanes): until then its
//          parameters are being reduced and updated;
//          With data.device_resident the rows are made on the GPU from the
//          sample ids instead (stages/resident_data.h): nothing is staged.
// replica: forward, loss and backward of its shard in its own task arena.
//          At the last micro-batch of an accumulation window, each gradient
//          bucket is all-reduced as soon as backward has filled it, and the
//          BN buffers are broadcast after (the allreduce stage waits for
//          them). Leaves its loss in PassState::lanes and emits the batch on
//          lane r.
#include <tbb/flow_graph.h>

#include "ops/cuda/batch_stager.h"
#include "ops/device.h"
#include "ops/test_fault.h"
#include "ops/trace.h"
#include "stages/pass_state.h"
#include "stages/run_context.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

class ForwardBackwardStage final : public Stage {
 public:
  ForwardBackwardStage(const StageInfo& info, const Args&) : Stage(info) {}

  StagePorts Build(FlowGraph& g, const RunContext& run, PassState& pass) override {
    using namespace tbb::flow;
    CNNFLOW_ENFORCE(run.replicas != nullptr, "forward_backward needs replicas");
    const int n = run.replicas->size();
    stagers_.clear();
    for (int r = 0; r < n; ++r) {
      const Device d = run.replicas->device(r);
      const GpuLaneScope lane(run.replicas->lane(r));  // the stager keeps its replica's lane
      stagers_.push_back(d.is_cuda() ? std::make_unique<BatchStager>(d) : nullptr);
    }
    split_ = std::make_unique<function_node<Message, Message>>(
        g, serial, [this, n, &run](const Message& m) {
          return Guarded([&] {
            if (m->rows_on_device) {
              // --dump-batches: the replicas copy their rows back into it.
              if (run.resident_rows_to_host) {
                m->inputs = Tensor::Empty(run.dataset(run.resident->name())
                                              .sample_shape()
                                              .WithBatch(static_cast<int64_t>(m->labels.size())),
                                          DType::kF32);
              }
              return m;
            }
            for (int r = 0; r < n; ++r) {
              const auto [b, e] = ReplicaRows(run, *m, r);
              if (stagers_[r] && e > b) {
                // Mixed targets (mixup, cutmix) travel in the same copy.
                LabelMix mix;
                if (!m->mix_labels.empty()) {
                  mix.other = m->mix_labels.data() + b;
                  mix.weight = m->mix_weights.data() + b;
                }
                staged_.Put(m->index, r, n,
                            stagers_[r]->Stage(m->inputs.Slice(b, e), m->labels.data() + b,
                                               m->mix_labels.empty() ? nullptr : &mix));
              }
            }
            return m;
          });
        });
    StagePorts ports;
    ports.input = split_.get();
    pass.lanes.release.assign(n, nullptr);
    for (int r = 0; r < n; ++r) {
      queues_.push_back(std::make_unique<queue_node<Message>>(g));
      gates_.push_back(std::make_unique<limiter_node<Message>>(g, 1));
      replicas_.push_back(std::make_unique<function_node<Message, Message>>(
          g, serial, [this, r, n, &run, &pass](const Message& m) {
            return Guarded([&] {
              if (r == 0) Tracer::AtStep(m->global_step);  // cnnflow train --trace: its window
              const TraceSpan span("step", [r] { return StrCat("replica ", r); });
              Run(run, pass, r, n, *m);
              return m;
            });
          }));
      make_edge(*split_, *queues_.back());
      make_edge(*queues_.back(), *gates_.back());
      make_edge(*gates_.back(), *replicas_.back());
      pass.lanes.release[r] = [gate = gates_.back().get()] {
        gate->decrementer().try_put(continue_msg());
      };
      ports.lane_outputs.push_back(replicas_.back().get());
    }
    return ports;
  }

 private:
  void Run(const RunContext& run, PassState& pass, int r, int n, BatchMessage& m) {
    ReplicaSet& set = *run.replicas;
    const GpuLaneScope lane(set.lane(r));
    // Rows staged to replica r's GPU, if any (a dropped batch's, freed).
    std::shared_ptr<BatchStager::Staged> staged = staged_.Take(m.index, r);
    const int64_t stop_after = run.control->stop_after_step.load();
    if (stop_after >= 0 && m.global_step > stop_after) {
      m.dropped = true;
      return;
    }
    if (r == 0) {  // CNNFLOW_TEST_FAULT and CNNFLOW_TEST_SLOW_START, for the fault tests
      MaybeInjectTestFault(m.global_step);
      MaybeSlowTestStart(m.global_step);
    }
    const auto [b, e] = ReplicaRows(run, m, r);
    // The gradient of the mean loss over the window's batches of all
    // replicas of all processes (the global batch's rows, however they fall
    // on the processes); buckets are summed. The members of a
    // tensor-parallel group train on the same rows: each takes 1/T (its
    // split layers scale their own parts back, ops/parallel/tensor_parallel.h).
    const int64_t global = GlobalRows(run, m);
    const double scale = global > 0 ? 1.0 / (static_cast<double>(global) * set.tensor_parallel() *
                                             static_cast<double>(pass.plan.WindowBatches(m.index)))
                                    : 0.0;
    ForwardContext ctx;
    ctx.training = true;
    ctx.seed = run.seed;
    ctx.step = m.micro_step;
    ctx.sample_ids = m.sample_ids.data() + b;
    LabelMix mix;
    if (!m.mix_labels.empty()) {
      mix.other = m.mix_labels.data() + b;
      mix.weight = m.mix_weights.data() + b;
    }
    if (staged) staged->WaitForCopy();
    // data.device_resident: the rows made on this replica's GPU, and its labels there.
    Tensor rows, device_labels;
    if (m.rows_on_device) {
      const Device device = set.device(r);
      rows = run.resident->MakeBatch(device, m.sample_ids.data() + b, e - b, run.seed, m.epoch);
      if (e > b) device_labels = LabelTensor(m.labels.data() + b, e - b, device);
      if (run.resident_rows_to_host && e > b) {
        CopyBytes(Device::Cpu(), m.inputs.Slice(b, e).raw_data(), device, rows.raw_data(),
                  rows.nbytes());
      }
    }
    const Tensor x = m.rows_on_device ? rows : staged ? staged->inputs() : m.inputs.Slice(b, e);
    const int64_t* labels_on_gpu = m.rows_on_device
                                       ? (e > b ? device_labels.data<int64_t>() : nullptr)
                                   : staged ? staged->labels()
                                            : nullptr;
    const ReplicaSet::Result res = set.ForwardBackward(
        r, x, m.labels.data() + b, ctx, scale, run.label_smoothing, pass.plan.EndsWindow(m.index),
        labels_on_gpu, m.mix_labels.empty() ? nullptr : &mix, staged ? staged->mix() : nullptr);
    if (staged) staged->Release();  // every kernel that reads the rows is issued
    // A group's rows count once, from its member 0.
    const bool counts = set.tensor_parallel_member(r) == 0;
    pass.lanes.results.Put(m.index, r, n,
                           {counts ? res.loss_sum : 0, counts ? res.correct : 0, res.pending});
  }

  std::vector<std::unique_ptr<BatchStager>> stagers_;  // per replica; null on a CPU
  // Each GPU replica's rows, on their way to its GPU, by batch.
  LaneSlots<std::shared_ptr<BatchStager::Staged>> staged_;
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
