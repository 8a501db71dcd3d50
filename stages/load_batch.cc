// load_batch: turns a batch of sample indices into one pooled tensor
// [N, ...] with labels. Inside, three oneTBB nodes:
//
//   split -> queue -> limiter -> decode (x threads) -> sequencer
//
// split:   allocates the batch tensor from the pool and cuts the batch into
//          slices of `slice` samples;
// decode:  reads, decodes, augments and normalises a slice's samples
//          straight into their rows of the batch tensor; at most `threads`
//          slices at once (a limiter the autotuner can move). The slice
//          that finishes a batch assembles it: bad records are dropped (or
//          fail the run) and the batch goes on;
// sequencer: restores sampler order unless `ordered` is off.
#include <tbb/flow_graph.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <mutex>

#include "ops/trace.h"
#include "stages/adjustable_limiter.h"
#include "stages/pass_state.h"
#include "stages/run_context.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

// This thread's CPU time (not the process's: the pool's idle workers spin).
int64_t ThreadCpuNs() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// A batch being loaded, shared by its slices.
struct BatchWork {
  Message batch;
  std::vector<ReadResult> results;  // one per sample
  std::atomic<int64_t> slices_left{0};
};

struct Slice {
  std::shared_ptr<BatchWork> work;
  int64_t begin = 0, end = 0;
};

class LoadBatchStage final : public Stage {
 public:
  LoadBatchStage(const StageInfo& info, const Args& args)
      : Stage(info),
        data_(args.String("data")),
        threads_(args.Int("threads")),
        slice_(args.Int("slice")),
        ordered_(args.Bool("ordered")),
        skip_bad_(args.String("on_bad_record") == "skip") {
    if (threads_ <= 0) throw ConfigError(StrCat("threads must be > 0, got ", threads_));
    if (slice_ <= 0) throw ConfigError(StrCat("slice must be > 0, got ", slice_));
  }

  StagePorts Build(FlowGraph& g, const RunContext& run, PassState& pass) override {
    using namespace tbb::flow;
    const Dataset* data = &run.dataset(data_);
    const std::string knob = info().node + ".threads";
    int64_t threads = threads_;
    if (auto it = pass.tuned.find(knob); it != pass.tuned.end()) threads = it->second;
    const int64_t max_threads = std::max(threads_, run.threads);
    threads = std::clamp<int64_t>(threads, 1, max_threads);

    split_ = std::make_unique<multifunction_node<Message, std::tuple<Slice>>>(
        g, serial, [this, data, &run, &pass](const Message& m, auto& out) {
          Guarded([&] { Split(*data, Resident(run, pass), m, std::get<0>(out)); });
        });
    queue_ = std::make_unique<queue_node<Slice>>(g);
    limiter_ = std::make_unique<AdjustableLimiter<Slice>>(g, threads, max_threads);
    decode_ = std::make_unique<multifunction_node<Slice, std::tuple<Message>>>(
        g, unlimited, [this, data, &run, &pass](const Slice& s, auto& out) {
          Guarded([&] {
            const int64_t cpu0 = ThreadCpuNs();
            {
              const TraceSpan span("load", "decode slice");
              Decode(*data, run, pass, s);  // (labels only, where the GPUs make the rows)
            }
            limiter_->Release();
            const bool last = s.work->slices_left.fetch_sub(1) == 1;
            if (last) Assemble(*data, pass, *s.work);
            run.control->loader_cpu_ns += ThreadCpuNs() - cpu0;
            if (last) std::get<0>(out).try_put(s.work->batch);
          });
        });
    make_edge(output_port<0>(*split_), *queue_);
    make_edge(*queue_, limiter_->node());
    make_edge(limiter_->node(), *decode_);
    pass.knobs.push_back({knob, threads, 1, max_threads, /*doubling=*/false,
                          [this](int64_t v) { return limiter_->SetLimit(v); }});

    StagePorts ports;
    ports.input = split_.get();
    ports.output = &output_port<0>(*decode_);
    if (ordered_) {
      order_ = std::make_unique<sequencer_node<Message>>(
          g, [](const Message& m) { return static_cast<size_t>(m->sequence); });
      make_edge(output_port<0>(*decode_), *order_);
      ports.output = order_.get();
    }
    return ports;
  }

 private:
  // The device-resident set this stage's batches come from, or null: only
  // for its own data set, in training passes.
  const ResidentData* Resident(const RunContext& run, const PassState& pass) const {
    return run.resident && run.resident->name() == data_ && pass.training() ? run.resident.get()
                                                                            : nullptr;
  }

  template <typename Port>
  void Split(const Dataset& data, const ResidentData* resident, const Message& m, Port& out) const {
    const auto n = static_cast<int64_t>(m->sample_ids.size());
    auto work = std::make_shared<BatchWork>();
    work->batch = m;
    work->results.resize(static_cast<size_t>(n));
    m->rows_on_device = resident != nullptr;
    if (resident != nullptr) {  // labels only: one slice
      m->inputs = Tensor();
      work->slices_left = 1;
      out.try_put(Slice{work, 0, n});
      return;
    }
    m->inputs = Tensor::Empty(data.sample_shape().WithBatch(n), DType::kF32);
    const int64_t slices = std::max<int64_t>(1, (n + slice_ - 1) / slice_);
    work->slices_left = slices;
    for (int64_t b = 0; b < slices; ++b) {
      out.try_put(Slice{work, b * n / slices, (b + 1) * n / slices});
    }
  }

  void Decode(const Dataset& data, const RunContext& run, const PassState& pass,
              const Slice& s) const {
    BatchMessage& m = *s.work->batch;
    if (m.rows_on_device) {  // every record was read once already: its label, or why not
      for (int64_t i = s.begin; i < s.end; ++i) {
        const int64_t id = m.sample_ids[i];
        s.work->results[static_cast<size_t>(i)] = {run.resident->label(id),
                                                   run.resident->BadRecord(id)};
      }
      return;
    }
    const Shape sample = data.sample_shape();
    const int64_t per = sample.numel();
    const ReadContext ctx{run.seed, m.epoch, pass.training()};
    float* dst = m.inputs.data<float>();
    const bool normalize = !data.normalizes();  // else the source did
    for (int64_t i = s.begin; i < s.end; ++i) {
      ReadResult& r = s.work->results[static_cast<size_t>(i)];
      r = data.Read(m.sample_ids[i], ctx, dst + i * per);
      if (r.ok() && normalize) run.transform.Apply(dst + i * per, sample);
    }
  }

  // Keeps the good samples, in order.
  void Assemble(const Dataset& data, PassState& pass, BatchWork& work) const {
    BatchMessage& m = *work.batch;
    const int64_t n = static_cast<int64_t>(m.sample_ids.size());
    const int64_t per = data.sample_shape().numel();
    float* dst = m.rows_on_device ? nullptr : m.inputs.data<float>();
    int64_t kept = 0;
    m.labels.clear();
    for (int64_t i = 0; i < n; ++i) {
      const ReadResult& r = work.results[static_cast<size_t>(i)];
      if (!r.ok()) {
        const std::string what =
            StrCat(data.Key(m.sample_ids[i]), " (sample ", m.sample_ids[i], "): ", r.error);
        if (!skip_bad_) throw Error(StrCat("bad record ", what, " (on_bad_record: fail)"));
        std::lock_guard<std::mutex> lock(pass.bad_records_mu);
        pass.bad_records.push_back(what);
        continue;
      }
      if (kept != i && dst != nullptr) std::copy_n(dst + i * per, per, dst + kept * per);
      m.labels.push_back(r.label);
      m.sample_ids[kept] = m.sample_ids[i];
      ++kept;
    }
    if (kept != n) {
      if (!m.rows_on_device) m.inputs = m.inputs.Slice(0, kept);
      m.sample_ids.resize(kept);
    }
  }

  std::string data_;
  int64_t threads_;
  int64_t slice_;
  bool ordered_;
  bool skip_bad_;
  std::unique_ptr<tbb::flow::multifunction_node<Message, std::tuple<Slice>>> split_;
  std::unique_ptr<tbb::flow::queue_node<Slice>> queue_;
  std::unique_ptr<AdjustableLimiter<Slice>> limiter_;
  std::unique_ptr<tbb::flow::multifunction_node<Slice, std::tuple<Message>>> decode_;
  std::unique_ptr<tbb::flow::sequencer_node<Message>> order_;
};

}  // namespace

CNNFLOW_REGISTER_STAGE(
    load_batch, LoadBatchStage,
    Schema("Reads, decodes and augments a batch's samples into one pooled tensor [N, ...], "
           "`threads` slices of `slice` samples at once, and applies the data transform "
           "(normalize).")
        .Optional("data", ParamType::kString, std::string("train"), "which data set (data.<name>)")
        .Optional("threads", ParamType::kInt, int64_t{1},
                  "slices decoded at once (autotune may move it, up to the run's threads)")
        .Optional("slice", ParamType::kInt, int64_t{32}, "samples per decode task")
        .Optional("ordered", ParamType::kBool, true,
                  "deliver batches in sampler order (else in arrival order)")
        .Choice("on_bad_record", {"fail", "skip"}, "fail",
                "a record that cannot be read: fail the run, or skip it and report it"));

// Its decode threads: what `cnnflow tune` varies.
CNNFLOW_STAGE_PLAN(load_batch, [](const Args&, const PlanNode& node, GraphPlan& plan) {
  plan.load_threads_args.push_back({node.name, "threads"});
});

}  // namespace cnnflow
