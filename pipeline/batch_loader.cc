#include "pipeline/batch_loader.h"

#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>

#include "loaders/sampler.h"
#include "loaders/source_registry.h"
#include "pipeline/executor.h"
#include "stages/pass_plan.h"
#include "stages/pass_state.h"
#include "stages/run_context.h"

namespace cnnflow {

std::shared_ptr<Dataset> OpenDataSet(const RunConfig& config, const std::string& name,
                                     SampleTransform* transform) {
  const auto it = config.data.find(name);
  if (it == config.data.end()) {
    throw ConfigError(StrCat(config.doc.path(), ": no data.", name, " set"));
  }
  const DataSpec& spec = it->second;
  const SourceType* type = SourceRegistry::Get().Find(spec.source);
  CNNFLOW_ENFORCE(type != nullptr, "unknown source ", spec.source);
  try {
    std::shared_ptr<Dataset> data = type->open(spec.args);
    // Image sources normalise as they write a sample (one pass, not two).
    if (!config.normalize_mean.empty()) {
      data->FuseNormalize(config.normalize_mean, config.normalize_std);
      if (transform) transform->AddNormalize(config.normalize_mean, config.normalize_std);
    }
    return data;
  } catch (const std::exception& e) {
    throw Error(StrCat("data.", name, " (", spec.source, "): ", e.what()));
  }
}

namespace {

// The loader graph: the train template's first three nodes (graphs/
// data_parallel.yaml) with the options' values, and the metrics sink that
// hands each batch on in sampler order.
GraphSpec LoaderGraph(const BatchLoaderOptions& o) {
  const std::string text = StrCat(
      "loader:\n  nodes:\n"
      "    sample: {stage: sampler, data: data, batch: ",
      o.batch, ", shuffle: ", o.shuffle ? "true" : "false",
      ", drop_last: ", o.drop_last ? "true" : "false", ", pad: true",
      "}\n"
      "    prefetch: {stage: prefetch, depth: ",
      o.prefetch,
      "}\n"
      "    load: {stage: load_batch, data: data, threads: ",
      o.threads, ", on_bad_record: ", o.on_bad_record,
      "}\n"
      "    out: {stage: metrics}\n"
      "  edges: [sample -> prefetch -> load -> out]\n");
  const YamlDoc doc = YamlDoc::Parse(text, "cnnflow loader graph");
  return ParseGraph(doc, "loader", YAML::Node(YAML::NodeType::Map), doc);
}

}  // namespace

BatchLoader::BatchLoader(std::shared_ptr<const Dataset> data, SampleTransform transform,
                         BatchLoaderOptions options)
    : data_(std::move(data)), transform_(std::move(transform)), options_(std::move(options)) {
  const BatchLoaderOptions& o = options_;
  if (o.batch <= 0) throw ConfigError(StrCat("batch must be > 0, got ", o.batch));
  if (o.threads <= 0) throw ConfigError(StrCat("threads must be > 0, got ", o.threads));
  if (o.prefetch <= 0) throw ConfigError(StrCat("prefetch must be > 0, got ", o.prefetch));
  if (o.on_bad_record != "fail" && o.on_bad_record != "skip") {
    throw ConfigError(StrCat("on_bad_record must be fail or skip, got '", o.on_bad_record, "'"));
  }
  SamplerOptions s;  // checks rank and world
  s.dataset_size = data_->size();
  s.rank = o.rank;
  s.world_size = o.world;
  s.uneven = !o.train;
  batches_ = ShardedSampler::NumBatches(ShardedSampler(s).num_samples(), o.batch, o.drop_last);
  LoaderGraph(o);  // its parameters checked now, not at the first epoch
  // One slot more than the decode threads (the sink waits there while the
  // caller has `prefetch` batches ready, without taking a decoder's slot),
  // within the threads TBB may run (more would only make it warn).
  const auto allowed = static_cast<int64_t>(
      tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
  arena_ = std::make_shared<tbb::task_arena>(static_cast<int>(std::min(o.threads + 1, allowed)));
}

BatchLoader::~BatchLoader() = default;

std::unique_ptr<BatchLoader::Epoch> BatchLoader::Start(int64_t epoch) const {
  std::unique_ptr<Epoch> e(new Epoch());
  e->capacity_ = static_cast<size_t>(options_.prefetch);
  e->control_ = std::make_unique<RunControl>();
  e->run_.reset(new RunContext{.datasets = {{"data", data_}},
                               .transform = transform_,
                               .seed = options_.seed,
                               .threads = options_.threads,
                               .control = e->control_.get(),
                               .data_rank = options_.rank,
                               .data_ranks = options_.world,
                               .replica_first = options_.rank,  // a process is one replica
                               .replicas_total = options_.world});
  Epoch* self = e.get();
  e->pass_.reset(new PassState{
      .pass = options_.train ? "train" : "eval",
      .epoch = epoch,
      .batch_bytes =
          options_.batch * data_->sample_shape().numel() * static_cast<int64_t>(sizeof(float)),
      .on_batch =
          [self](const BatchMessage& m, PassState&) {
            self->Put(LoadedBatch{m.inputs, m.labels, m.index});
          },
  });
  auto arena = std::static_pointer_cast<tbb::task_arena>(arena_);
  GraphSpec graph = LoaderGraph(options_);
  e->thread_ = std::thread([self, arena, graph = std::move(graph)] {
    std::exception_ptr error;
    try {
      self->pass_->start = std::chrono::steady_clock::now();
      arena->execute([&] { RunGraph(graph, *self->run_, *self->pass_); });
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(self->mu_);
    self->done_ = true;
    if (!self->closed_) self->error_ = error;
    self->cv_.notify_all();
  });
  return e;
}

void BatchLoader::Epoch::Put(LoadedBatch b) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return closed_ || ready_.size() < capacity_; });
  if (closed_) return;  // nobody takes it any more: its memory goes back now
  ready_.push_back(std::move(b));
  cv_.notify_all();
}

bool BatchLoader::Epoch::Next(LoadedBatch& out) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !ready_.empty() || done_; });
  if (!ready_.empty()) {
    out = std::move(ready_.front());
    ready_.pop_front();
    cv_.notify_all();
    return true;
  }
  if (error_) std::rethrow_exception(error_);
  return false;
}

void BatchLoader::Epoch::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    ready_.clear();
    cv_.notify_all();
  }
  control_->stop_requested = true;  // the sampler stops at its next batch
  if (thread_.joinable()) thread_.join();
}

std::vector<std::string> BatchLoader::Epoch::bad_records() const {
  std::lock_guard<std::mutex> lock(pass_->bad_records_mu);
  return pass_->bad_records;
}

BatchLoader::Epoch::~Epoch() { Close(); }

}  // namespace cnnflow
