// load_batch: reads a batch's samples from its data set into one pooled
// tensor [N, ...] and applies the per-sample transform. Runs `threads`
// batches at once; a sequencer restores sampler order unless `ordered` is off.
// A bad record fails the run naming its key, or with `on_bad_record: skip`
// is left out of its batch and reported at the end of the pass.
#include <tbb/flow_graph.h>

#include <algorithm>
#include <mutex>

#include "ops/cpu/parallel.h"
#include "stages/run_state.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

class LoadBatchStage final : public Stage {
 public:
  LoadBatchStage(const StageInfo& info, const Args& args)
      : Stage(info),
        data_(args.String("data")),
        threads_(args.Int("threads")),
        ordered_(args.Bool("ordered")),
        skip_bad_(args.String("on_bad_record") == "skip") {
    if (threads_ <= 0) throw ConfigError(StrCat("threads must be > 0, got ", threads_));
  }

  StagePorts Build(FlowGraph& g, RunState& state) override {
    const Dataset* data = &state.dataset(data_);
    load_ = std::make_unique<tbb::flow::function_node<Message, Message>>(
        g, static_cast<size_t>(threads_), [this, data, &state](const Message& m) {
          return Guarded([&] {
            Load(*data, state, *m);
            return m;
          });
        });
    StagePorts ports;
    ports.input = load_.get();
    ports.output = load_.get();
    if (ordered_) {
      order_ = std::make_unique<tbb::flow::sequencer_node<Message>>(
          g, [](const Message& m) { return static_cast<size_t>(m->index); });
      tbb::flow::make_edge(*load_, *order_);
      ports.output = order_.get();
    }
    return ports;
  }

 private:
  void Load(const Dataset& data, RunState& state, BatchMessage& m) const {
    const Shape sample = data.sample_shape();
    const int64_t n = static_cast<int64_t>(m.sample_ids.size());
    const int64_t per = sample.numel();
    const ReadContext ctx{state.seed, m.epoch, state.pass == "train"};
    m.inputs = Tensor::Empty(sample.WithBatch(n), DType::kF32);
    std::vector<ReadResult> results(static_cast<size_t>(n));
    float* dst = m.inputs.data<float>();
    cpu::ParallelFor(n, 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        results[i] = data.Read(m.sample_ids[i], ctx, dst + i * per);
        if (results[i].ok()) state.transform.Apply(dst + i * per, sample);
      }
    });
    // Keep the good samples, in order.
    int64_t kept = 0;
    m.labels.clear();
    for (int64_t i = 0; i < n; ++i) {
      const ReadResult& r = results[i];
      if (!r.ok()) {
        const std::string what = StrCat(data.Key(m.sample_ids[i]), " (sample ", m.sample_ids[i],
                                        "): ", r.error);
        if (!skip_bad_) throw Error(StrCat("bad record ", what, " (on_bad_record: fail)"));
        std::lock_guard<std::mutex> lock(state.bad_records_mu);
        state.bad_records.push_back(what);
        continue;
      }
      if (kept != i) std::copy_n(dst + i * per, per, dst + kept * per);
      m.labels.push_back(r.label);
      ++kept;
    }
    if (kept != n) m.inputs = m.inputs.Slice(0, kept);
  }

  std::string data_;
  int64_t threads_;
  bool ordered_;
  bool skip_bad_;
  std::unique_ptr<tbb::flow::function_node<Message, Message>> load_;
  std::unique_ptr<tbb::flow::sequencer_node<Message>> order_;
};

}  // namespace

CNNFLOW_REGISTER_STAGE(
    load_batch, LoadBatchStage,
    Schema("Reads the batch's samples into one pooled tensor [N, ...] and applies the data "
           "transform (normalize).")
        .Optional("data", ParamType::kString, std::string("train"), "which data set (data.<name>)")
        .Optional("threads", ParamType::kInt, int64_t{1}, "batches loaded at once")
        .Optional("ordered", ParamType::kBool, true,
                  "deliver batches in sampler order (else in arrival order)")
        .Choice("on_bad_record", {"fail", "skip"}, "fail",
                "a record that cannot be read: fail the run, or skip it and report it"));

}  // namespace cnnflow
