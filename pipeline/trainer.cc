#include "pipeline/trainer.h"

#include <tbb/global_control.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loaders/sampler.h"
#include "loaders/source_registry.h"
#include "ops/safetensors.h"
#include "pipeline/executor.h"

namespace cnnflow {

namespace fs = std::filesystem;

namespace {

std::string Timestamp() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&now));
  return buf;
}

// A fresh folder <parent>/<name>-<time>[-k].
std::string MakeRunDir(const std::string& parent, const std::string& name) {
  fs::create_directories(parent);
  const std::string base = (fs::path(parent) / (name + "-" + Timestamp())).string();
  std::string dir = base;
  for (int k = 2; fs::exists(dir); ++k) dir = base + "-" + std::to_string(k);
  fs::create_directories(dir);
  return dir;
}

}  // namespace

Trainer::Trainer(RunConfig config) : config_(std::move(config)) {
  thread_limit_ = std::make_shared<tbb::global_control>(
      tbb::global_control::max_allowed_parallelism, static_cast<size_t>(config_.threads));

  // The model first: a shape error is reported before any data is read.
  model_ = Model::Build(config_.layers, config_.input_shape, DType::kF32, config_.seed, config_.init);
  for (const auto& [name, spec] : config_.data) {
    const SourceType* type = SourceRegistry::Get().Find(spec.source);
    CNNFLOW_ENFORCE(type != nullptr, "unknown source ", spec.source);
    try {
      state_.datasets[name] = type->open(spec.args);
    } catch (const std::exception& e) {
      throw Error(StrCat("data.", name, " (", spec.source, "): ", e.what()));
    }
  }
  const Dataset& train = state_.dataset("train");
  if (train.sample_shape() != config_.input_shape) {
    throw ShapeError(StrCat(config_.doc.path(), ": model.input is ", config_.input_shape,
                            " but data.train (", train.description(), ") has samples of ",
                            train.sample_shape()));
  }
  if (!config_.normalize_mean.empty()) {
    state_.transform.AddNormalize(config_.normalize_mean, config_.normalize_std);
  }

  const Shape out = model_->output_shape();
  if (out.rank() != 1 || out[0] < train.num_classes()) {
    throw ShapeError(StrCat("the last layer '", model_->layer(model_->num_layers() - 1).name(),
                            "' produces ", out, ", but the loss needs [classes] with at least ",
                            train.num_classes(), " classes (data.train has ", train.num_classes(),
                            ")"));
  }

  steps_per_epoch_ = ShardedSampler::NumBatches(train.size(), config_.batch, false);
  if (config_.max_steps > 0) steps_per_epoch_ = std::min(steps_per_epoch_, config_.max_steps);
  const Args& s = config_.schedule_args;
  const int64_t global_batch = config_.batch * static_cast<int64_t>(config_.devices.size());
  LrScheduleOptions lr;
  lr.base_lr = config_.optimizer_args.Float("lr");
  if (s.String("scale_lr") == "linear") {
    const int64_t base_batch = s.Int("base_batch") > 0 ? s.Int("base_batch") : config_.batch;
    lr.base_lr = ScaleLr(lr.base_lr, global_batch, base_batch);
  }
  lr.decay = s.String("decay");
  lr.total_steps = steps_per_epoch_ * config_.epochs;
  lr.warmup_steps = static_cast<int64_t>(std::llround(s.Float("warmup_epochs") * steps_per_epoch_));
  lr.step_size = static_cast<int64_t>(std::llround(s.Float("step_epochs") * steps_per_epoch_));
  lr.warmup_start_factor = s.Float("warmup_start_factor");
  lr.gamma = s.Float("gamma");
  lr.min_lr = s.Float("min_lr");
  schedule_ = std::make_unique<LrSchedule>(lr);
  optimizer_ = MakeOptimizer(config_.optimizer, config_.optimizer_args, model_->NamedParameters());

  state_.model = model_.get();
  state_.optimizer = optimizer_.get();
  state_.schedule = schedule_.get();
  state_.seed = config_.seed;
  state_.threads = config_.threads;
  if (config_.autotune) autotuner_ = std::make_unique<Autotuner>();
  state_.label_smoothing = config_.label_smoothing;
  state_.max_steps = config_.max_steps;
}

Trainer::~Trainer() = default;

PassMetrics Trainer::RunPass(const GraphSpec& graph, const std::string& pass, int64_t epoch) {
  state_.epoch = epoch;
  state_.pass = pass;
  state_.metrics = PassMetrics();
  state_.bad_records.clear();
  state_.knobs.clear();
  const int64_t batch = pass == "train" ? config_.batch : config_.eval_batch;
  state_.batch_bytes = batch * state_.dataset(pass == "train" ? "train" : "test").sample_shape().numel() *
                       static_cast<int64_t>(sizeof(float));
  Autotuner* tuner = pass == "train" ? autotuner_.get() : nullptr;
  state_.tuned.clear();  // evaluation runs as configured
  if (tuner) {
    state_.tuned = tuner->values();
    tuner->StartPass();
  }
  state_.pass_start = std::chrono::steady_clock::now();
  state_.on_batch = [this, pass, epoch, tuner](const BatchMessage& m, const PassMetrics& p) {
    if (tuner) {
      for (const AutotuneDecision& d : tuner->Observe(state_.knobs, p.samples, p.seconds)) {
        LogAutotune(d);
      }
    }
    if (progress_ == nullptr) return;
    progress_->Batch(pass, epoch + 1, config_.epochs, m.index + 1, state_.pass_batches,
                     p.mean_loss(), p.accuracy(), p.samples_per_second(), p.seconds);
  };
  RunGraph(graph, state_);
  if (progress_) progress_->EndPass();
  state_.metrics.skipped = static_cast<int64_t>(state_.bad_records.size());
  if (progress_ && !state_.bad_records.empty()) {
    std::string list;
    for (size_t i = 0; i < state_.bad_records.size() && i < 10; ++i) list += "\n  " + state_.bad_records[i];
    progress_->Line(StrCat("skipped ", state_.bad_records.size(), " bad record(s) in the ", pass,
                           " pass of epoch ", epoch + 1, ":", list,
                           state_.bad_records.size() > 10 ? "\n  ..." : ""));
  }
  return state_.metrics;
}

void Trainer::LogAutotune(const AutotuneDecision& d) {
  if (progress_) progress_->Line(d.ToString());
  if (autotune_log_) {
    *autotune_log_ << d.batch << "," << d.action << "," << d.knob << "," << d.from << "," << d.to
                   << "," << d.rate_before << "," << d.rate_after << ",\"" << d.reason << "\"\n";
    autotune_log_->flush();
  }
}

PassMetrics Trainer::Evaluate() {
  if (state_.datasets.count("test") == 0) throw ConfigError("no data.test set to evaluate on");
  const int64_t saved = state_.max_steps;
  state_.max_steps = 0;  // evaluation always covers the whole test set
  PassMetrics m = RunPass(config_.eval_graph, "eval", state_.epoch);
  state_.max_steps = saved;
  return m;
}

EpochReport Trainer::Train(const std::string& run_dir) {
  run_dir_ = run_dir.empty() ? MakeRunDir(config_.output_dir, config_.name) : run_dir;
  fs::create_directories(run_dir_);
  {
    std::ofstream cfg(fs::path(run_dir_) / "config.yaml");
    cfg << "# resolved config of run " << config_.name << " (from " << config_.doc.path() << ")\n";
    for (const auto& o : config_.overrides) cfg << "# --set " << o << "\n";
    YAML::Emitter e;
    e << config_.doc.root();
    cfg << e.c_str() << "\n";
  }
  if (autotuner_) {
    autotune_log_ = std::make_unique<std::ofstream>(fs::path(run_dir_) / "autotune.csv");
    *autotune_log_ << "batch,action,knob,from,to,images_per_s_before,images_per_s_after,reason\n";
  }
  std::ofstream csv(fs::path(run_dir_) / "metrics.csv");
  csv << "epoch,train_loss,train_accuracy,test_loss,test_accuracy,images_per_s,seconds,lr,"
         "skipped_records\n";

  EpochReport report;
  for (int64_t epoch = 0; epoch < config_.epochs && !state_.stop_requested; ++epoch) {
    report.epoch = epoch + 1;
    report.train = RunPass(config_.train_graph, "train", epoch);
    report.lr = schedule_->At(std::max<int64_t>(state_.global_step - 1, 0));
    if (state_.stop_requested) break;
    if (state_.datasets.count("test")) report.test = RunPass(config_.eval_graph, "eval", epoch);
    char row[256];
    std::snprintf(row, sizeof row, "%lld,%.6f,%.6f,%.6f,%.6f,%.1f,%.3f,%.6g,%lld",
                  static_cast<long long>(report.epoch), report.train.mean_loss(),
                  report.train.accuracy(), report.test.mean_loss(), report.test.accuracy(),
                  report.train.samples_per_second(), report.train.seconds, report.lr,
                  static_cast<long long>(report.train.skipped + report.test.skipped));
    csv << row << "\n";
    csv.flush();
    if (progress_) {
      progress_->Line(StrCat("epoch ", report.epoch, "/", config_.epochs, ": train loss ",
                             report.train.mean_loss(), ", test loss ", report.test.mean_loss(),
                             ", test accuracy ", 100 * report.test.accuracy(), "%, ",
                             static_cast<int64_t>(report.train.samples_per_second()), " img/s"));
    }
  }
  SaveSafetensors((fs::path(run_dir_) / "model.safetensors").string(), model_->StateTensors(),
                  {{"config", config_.name}, {"epochs", std::to_string(report.epoch)},
                   {"format", "pt"}});
  return report;
}

void Trainer::LoadWeights(const std::string& path) {
  SafetensorsFile file = LoadSafetensors(path);
  for (auto& [name, tensor] : model_->StateTensors()) {
    const Tensor* t = file.Find(name);
    if (t == nullptr) throw Error(StrCat(path, ": has no tensor '", name, "' that the model needs"));
    if (t->shape() != tensor.shape()) {
      throw ShapeError(StrCat(path, ": '", name, "' has shape ", t->shape(), ", the model needs ",
                              tensor.shape()));
    }
    Tensor dst = tensor;
    dst.CopyFrom(t->dtype() == tensor.dtype() ? *t : t->Cast(tensor.dtype()));
  }
}

std::string Trainer::Describe() const {
  std::ostringstream os;
  Model& m = *model_;
  os << "model (input " << m.input_shape() << "):\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-12s %-15s %-14s %-18s %12s %14s\n", "layer", "type", "inputs",
                "output", "parameters", "MFLOPs/sample");
  os << line;
  for (int i = 0; i < m.num_layers(); ++i) {
    Layer& l = m.layer(i);
    int64_t params = 0;
    for (auto& p : l.parameters()) params += p.value.numel();
    std::string ins;
    for (const auto& n : m.inputs_of(i)) ins += (ins.empty() ? "" : ",") + n;
    std::snprintf(line, sizeof line, "  %-12s %-15s %-14s %-18s %12lld %14.3f\n", l.name().c_str(),
                  l.type(), ins.c_str(), m.output_shape(i).ToString().c_str(),
                  static_cast<long long>(params), l.ForwardFlops(1) / 1e6);
    os << line;
  }
  os << "  total parameters: " << m.NumParameters() << ", forward "
     << m.ForwardFlops(1) / 1e6 << " MFLOPs per sample\n";
  os << "train graph (" << config_.train_graph.file << "):\n" << config_.train_graph.ToString();
  os << "eval graph:\n" << config_.eval_graph.ToString();
  os << "threads: " << config_.threads << ", devices:";
  for (const auto& d : config_.devices) os << " " << d.ToString();
  os << ", steps per epoch: " << steps_per_epoch_ << "\n";
  return os.str();
}

}  // namespace cnnflow
