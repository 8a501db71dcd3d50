// sampler: the source of a pass. Cuts this epoch's order of a data set
// (ShardedSampler, seeded by (seed, epoch)) into batches of indices and
// emits one message per batch.
#include "loaders/sampler.h"

#include <tbb/flow_graph.h>

#include "stages/pass_state.h"
#include "stages/run_context.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

class SamplerStage final : public Stage {
 public:
  SamplerStage(const StageInfo& info, const Args& args)
      : Stage(info),
        data_(args.String("data")),
        replica_batch_(args.Int("batch")),
        replicas_(std::max<int64_t>(1, args.Int("replicas"))),
        batch_(replica_batch_ * replicas_),
        shuffle_(args.Bool("shuffle")),
        drop_last_(args.Bool("drop_last")),
        pad_(args.Bool("pad")) {
    if (batch_ <= 0) throw ConfigError(StrCat("batch must be > 0, got ", batch_));
  }

  StagePorts Build(FlowGraph& g, const RunContext& run, PassState& pass) override {
    const Dataset& data = run.dataset(data_);
    SamplerOptions opt;
    opt.dataset_size = data.size();
    opt.shuffle = shuffle_;
    opt.seed = run.seed;
    // Each process trains its part of every global batch (the last, short
    // one cut as in-process replicas would cut it) and evaluates (every
    // sample once) its shard; the trainer sums the metrics.
    opt.rank = run.data_rank;
    opt.world_size = run.data_ranks;
    const bool train = pass.training();
    opt.uneven = !train;
    // The global batch does not depend on the process count (unless padded
    // round-robin shards were asked for): one replica's batch for each of
    // the run's replicas, this process taking its replicas' blocks.
    if (!pad_) {
      if (train && replicas_ != run.replica_count) {
        throw ConfigError(StrCat("sampler: replicas is ", replicas_, " but this process trains ",
                                 run.replica_count, " data-parallel replicas ($graph.replicas)"));
      }
      opt.block = replica_batch_;
      opt.blocks = run.replicas_total;
      opt.first_block = run.replica_first;
      opt.rank_blocks = run.replica_count;
    }
    ShardedSampler sampler(opt);
    order_ = sampler.EpochIndices(pass.epoch);
    // Training in blocks counts the global batches, so every process runs
    // each step, an empty part included; otherwise each process counts its
    // own shard's (equal when padded).
    global_batch_ = train && !pad_ ? replica_batch_ * run.replicas_total : 0;
    const bool global = global_batch_ > 0;
    batches_ = PassBatches(global ? data.size() : static_cast<int64_t>(order_.size()),
                           global ? global_batch_ : batch_, drop_last_, pass.max_batches);
    global_samples_ = data.size();
    // A resumed epoch starts after what was trained.
    pass.plan =
        PassPlan(batches_, run.accumulate, pass.start_batch, pass.global_step, pass.batches_done);
    next_ = pass.plan.first();
    const int64_t start = next_;
    node_ = std::make_unique<tbb::flow::input_node<Message>>(
        g, [this, &run, &pass, start](tbb::flow_control& fc) -> Message {
          return Guarded([&]() -> Message {
            // A stop request ends the pass at an optimizer step's boundary.
            if (next_ >= batches_ || (pass.stop_batch > 0 && next_ >= pass.stop_batch) ||
                (run.control->stop_requested.load() && pass.plan.StartsWindow(next_))) {
              fc.stop();
              return nullptr;
            }
            auto m = std::make_shared<BatchMessage>();
            m->epoch = pass.epoch;
            m->index = next_;
            m->sequence = next_ - start;
            ++pass.sampled;
            m->global_step = pass.plan.GlobalStep(next_);
            m->micro_step = pass.plan.MicroStep(next_);
            const int64_t begin = next_ * batch_;
            const int64_t end =
                std::min<int64_t>(begin + batch_, static_cast<int64_t>(order_.size()));
            m->sample_ids.assign(order_.begin() + begin, order_.begin() + end);
            if (global_batch_ > 0) {
              m->global_rows = std::min(global_batch_, global_samples_ - next_ * global_batch_);
            }
            ++next_;
            return m;
          });
        });
    StagePorts ports;
    ports.output = node_.get();
    ports.activate = [this] { node_->activate(); };
    return ports;
  }

 private:
  std::string data_;
  int64_t replica_batch_, replicas_;
  int64_t batch_;  // this process's: replica_batch_ x replicas_
  // Training in blocks: the global batch and the set (0: each process counts its own).
  int64_t global_batch_ = 0, global_samples_ = 0;
  bool shuffle_, drop_last_, pad_;
  std::vector<int64_t> order_;
  int64_t batches_ = 0;
  int64_t next_ = 0;
  std::unique_ptr<tbb::flow::input_node<Message>> node_;
};

}  // namespace

CNNFLOW_REGISTER_STAGE(
    sampler, SamplerStage,
    Schema("Source of a pass: this epoch's order of a data set, reshuffled from (seed, epoch), "
           "cut into batches of sample indices.")
        .Required("batch", ParamType::kInt, "samples per batch (per replica)")
        .Optional("replicas", ParamType::kInt, int64_t{1},
                  "replicas in this process: a batch holds `batch` samples for each")
        .Optional("data", ParamType::kString, std::string("train"), "which data set (data.<name>)")
        .Optional("shuffle", ParamType::kBool, true, "reshuffle every epoch")
        .Optional("drop_last", ParamType::kBool, false, "drop the last incomplete batch")
        .Optional("pad", ParamType::kBool, false,
                  "training over processes: deal the order round-robin, each process's shard "
                  "padded with repeats to the same size (torch's DistributedSampler; "
                  "cnnflow.Loader). false: each step's global batch is one run of the order, its "
                  "short last one cut among the processes as in-process replicas would cut it"));

// The pass's batches: what the trainer counts its optimizer steps by.
CNNFLOW_STAGE_PLAN(sampler, [](const Args& a, const PlanNode& node, GraphPlan& plan) {
  if (plan.batch_samples > 0) {
    throw ConfigError(StrCat(node.where, ": a second sampler in one pass"));
  }
  plan.batch_samples = a.Int("batch") * a.Int("replicas");
  plan.replica_batch = a.Int("batch");
  plan.drop_last = a.Bool("drop_last");
});

}  // namespace cnnflow
