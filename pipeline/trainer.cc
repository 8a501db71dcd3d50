#include "pipeline/trainer.h"

#include <tbb/global_control.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "loaders/sampler.h"
#include "loaders/source_registry.h"
#include "ops/io/file_write.h"
#include "ops/io/safetensors.h"
#include "ops/io/tf_events.h"
#include "pipeline/checkpoint.h"
#include "pipeline/executor.h"
#include "pipeline/validate_report.h"

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

// The replicas (data parallel), or the pipeline's stages (graph.pipeline),
// each device getting an equal share of the thread budget.
void Trainer::BuildModel(MpiWorld& world) {
  const int replicas = static_cast<int>(config_.devices.size());
  if (config_.pipeline) {
    PipelineOptions po;
    po.stages = config_.pipeline_stages;
    if (po.stages.empty()) {  // stages: auto
      auto whole = Model::Build(config_.layers, config_.input_shape, DType::kF32, config_.seed,
                                config_.init);
      po.stages = BalancedCut(*whole, replicas);
    }
    po.microbatches = static_cast<int>(config_.microbatches);
    po.schedule = ParsePipelineSchedule(config_.pipeline_schedule);
    po.threads_per_stage = config_.threads / replicas;
    pipeline_ = std::make_unique<PipelineModel>(config_.layers, config_.input_shape, config_.seed,
                                                config_.init, config_.optimizer,
                                                config_.optimizer_args, po);
    model_ = &pipeline_->full();
  } else {
    DataParallelOptions dp;
    dp.replicas = replicas;
    dp.threads_per_replica = config_.threads / replicas;
    dp.bucket_mb = config_.bucket_mb;
    dp.broadcast_buffers = config_.broadcast_buffers;
    dp.sync_bn = config_.sync_bn;
    dp.timeout_s = config_.collective_timeout_s;
    dp.devices = config_.devices;
    dp.compute = config_.compute;
    dp.tensor_parallel = config_.tensor_parallel;
    dp.split_layers = config_.split_layers;
    if (dp.devices[0].is_cuda()) {
      // Under mpirun the processes of a node take the next GPUs in turn:
      // process k of a node with devices [cuda:0, cuda:1] takes cuda:2k, cuda:2k+1.
      for (Device& d : dp.devices) {
        d.index += world.local_rank() * replicas;
        if (d.index >= CudaDeviceCount()) {
          throw ConfigError(StrCat(world.active() ? world.Where() : std::string("this process"),
                                   " would use ", d.ToString(), " but ", CudaDeviceCount(),
                                   " GPUs were found",
                                   CudaAvailable() ? "" : " (no usable GPU or CUDA driver)"));
        }
      }
    }
    replicas_ = std::make_unique<ReplicaSet>(config_.layers, config_.input_shape, config_.seed,
                                             config_.init, config_.optimizer,
                                             config_.optimizer_args, dp, world);
    model_ = &replicas_->model(0);
  }
}

Trainer::Trainer(RunConfig config) : config_(std::move(config)) {
  thread_limit_ = std::make_shared<tbb::global_control>(
      tbb::global_control::max_allowed_parallelism, static_cast<size_t>(config_.threads));
  arena_ = std::make_unique<tbb::task_arena>(config_.threads);

  MpiWorld& world = MpiWorld::Get();
  state_.process_rank = world.rank();
  state_.process_count = world.size();
  state_.collective_timeout_s = config_.collective_timeout_s;
  const int replicas = static_cast<int>(config_.devices.size());
  if (config_.threads < replicas) {  // replicas block for each other: each needs a thread
    throw ConfigError(StrCat(config_.doc.path(), ": ", replicas, " replicas need at least ",
                             replicas, " threads (threads: ", config_.threads, ")"));
  }
  // Every process must run the same config (and so the same graph and
  // parameter shapes): a mismatch fails on every rank at once.
  config_hash_ = ConfigHash(ResolvedConfigText());
  if (world.active()) {
    world.AgreeOnHash(std::stoull(config_hash_, nullptr, 16), "the resolved config",
                      config_.collective_timeout_s);
  }

  // The model first: a shape error is reported before any data is read.
  BuildModel(world);
  // The processes of a tensor-parallel group that spans processes share
  // one data shard.
  const int group_processes = replicas_ ? replicas_->tensor_parallel_processes() : 1;
  state_.data_rank = state_.process_rank / group_processes;
  state_.data_ranks = state_.process_count / group_processes;
  for (const auto& [name, spec] : config_.data) {
    const SourceType* type = SourceRegistry::Get().Find(spec.source);
    CNNFLOW_ENFORCE(type != nullptr, "unknown source ", spec.source);
    try {
      auto data = type->open(spec.args);
      // Image sources normalise as they write a sample (one pass, not two).
      if (!config_.normalize_mean.empty()) {
        data->FuseNormalize(config_.normalize_mean, config_.normalize_std);
      }
      state_.datasets[name] = std::move(data);
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

  // Optimizer steps per epoch: this process's shard in the training
  // graph's sampler's batches (a user template's sampler may cut them
  // otherwise than train.batch), accumulate batches a step.
  const GraphPlan plan = config_.train_graph.Plan();
  if (plan.batch_samples <= 0) {
    throw ConfigError(StrCat(config_.train_graph.file, ": the train graph has no sampler"));
  }
  const int64_t shard = (train.size() + state_.data_ranks - 1) / state_.data_ranks;
  steps_per_epoch_ =
      PassPlan(PassBatches(shard, plan.batch_samples, plan.drop_last, config_.max_steps),
               config_.accumulate)
          .steps();
  const Args& s = config_.schedule_args;
  const int64_t global_batch = plan.batch_samples * state_.data_ranks * config_.accumulate;
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

  // Before the ema node's average starts from the model (a resume then
  // loads its checkpoint over both).
  if (!config_.init_from.weights.empty()) InitFromWeights();

  state_.replicas = replicas_.get();
  state_.pipeline = pipeline_.get();
  state_.model = model_;
  state_.accumulate = config_.accumulate;
  state_.schedule = schedule_.get();
  state_.seed = config_.seed;
  state_.threads = config_.threads;
  if (config_.autotune) autotuner_ = std::make_unique<Autotuner>();
  state_.label_smoothing = config_.label_smoothing;
  state_.max_steps = config_.max_steps;
  for (const NodeSpec& n : config_.train_graph.nodes) {
    if (n.stage != "ema") continue;
    if (!replicas_) {
      throw ConfigError(StrCat(n.where, ": node '", n.name,
                               "' (ema) averages data-parallel replicas; a pipeline has none"));
    }
    CNNFLOW_ENFORCE(ema_ == nullptr, n.where, ": a second ema node");
    if (replicas_->tensor_parallel() > 1) {
      throw ConfigError(StrCat(n.where, ": node '", n.name,
                               "' (ema) does not combine with graph.tensor_parallel yet"));
    }
    ema_ = std::make_unique<WeightAverage>(replicas_->model(0), n.args.Float("decay"),
                                           n.args.Bool("warmup"));
    ema_eval_ = n.args.Bool("eval");
  }
  state_.ema = ema_.get();
}

Trainer::~Trainer() = default;

PassMetrics Trainer::RunPass(const GraphSpec& graph, const std::string& pass, int64_t epoch,
                             const BatchObserver& observe) {
  state_.epoch = epoch;
  state_.pass = pass;
  state_.metrics = PassMetrics();
  state_.bad_records.clear();
  state_.knobs.clear();
  state_.lanes = DeviceLanes();  // set by this graph's forward_backward, if it has one
  const int64_t batch = pass == "train"
                            ? config_.batch * (replicas_ ? replicas_->data_parallel() : 1)
                            : config_.eval_batch;
  state_.batch_bytes = batch *
                       state_.dataset(pass == "train" ? "train" : "test").sample_shape().numel() *
                       static_cast<int64_t>(sizeof(float));
  Autotuner* tuner = pass == "train" ? autotuner_.get() : nullptr;
  state_.tuned.clear();  // evaluation runs as configured
  if (tuner) {
    state_.tuned = tuner->values();
    tuner->StartPass();
  }
  state_.pass_start = std::chrono::steady_clock::now();
  state_.on_batch = [this, pass, epoch, tuner, &observe](const BatchMessage& m,
                                                         const PassMetrics& p) {
    if (observe) observe(m, p);
    if (events_ && pass == "train") {  // as the metrics stage adds to p
      const auto n = static_cast<int64_t>(m.labels.size());
      window_.loss_sum += m.loss * static_cast<double>(n);
      window_.correct += m.correct;
      window_.samples += n;
    }
    if (events_ && pass == "train" && config_.log_every > 0 && !m.dropped &&
        state_.plan.EndsWindow(m.index) && (m.global_step + 1) % config_.log_every == 0) {
      LogStepScalars(m.global_step + 1, m, p);
    }
    if (tuner) {
      for (const AutotuneDecision& d :
           tuner->Observe(state_.knobs, p.samples, p.seconds, m.step_busy_seconds)) {
        LogAutotune(d);
      }
    }
    if (progress_ == nullptr) return;
    progress_->Batch(pass, epoch + 1, config_.epochs, m.index + 1, state_.plan.batches(),
                     p.mean_loss(), p.accuracy(), p.samples_per_second(), p.seconds);
  };
  state_.sampled = 0;
  if (events_ && pass == "train") window_.mark = 0;  // the segment's seconds start at 0
  if (pipeline_) pipeline_->ResetStats();
  // In an arena of exactly the run's threads: replicas block while they wait
  // for each other, so each needs a thread of its own, even where `threads`
  // exceeds the cores (the default arena has one slot per core).
  arena_->execute([&] { RunGraph(graph, state_); });
  if (progress_) progress_->EndPass();
  // Every batch must come out: one that does not is held by a node (a bug),
  // and would silently be missing from training.
  if (state_.metrics.batches != state_.sampled) {
    throw Error(StrCat("graph '", graph.name, "' of ", graph.file, " ended with ",
                       state_.sampled - state_.metrics.batches, " of ", state_.sampled,
                       " batches not delivered to its end"));
  }
  state_.metrics.skipped = static_cast<int64_t>(state_.bad_records.size());
  if (events_ && pass == "train") {
    window_.seconds += state_.metrics.seconds - window_.mark;
    window_.mark = 0;
  }
  if (pass == "train" && pipeline_ && progress_ && state_.metrics.batches > 0) {
    std::string measured;
    for (double b : pipeline_->bubble())
      measured += StrCat(measured.empty() ? "" : ", ", static_cast<int>(100 * b + 0.5), "%");
    progress_->Line(StrCat("pipeline: ", pipeline_->num_stages(), " stages, ", config_.microbatches,
                           " micro-batches (", config_.pipeline_schedule,
                           "): idle share per stage ", measured, "; theoretical bubble ",
                           static_cast<int>(100 * pipeline_->theoretical_bubble() + 0.5), "%"));
  }
  // In an MPI job each process trained or evaluated its shard: report the
  // whole (a shard that processes share counted once).
  MpiWorld& world = MpiWorld::Get();
  if (world.active()) {
    PassMetrics& m = state_.metrics;
    float totals[4] = {static_cast<float>(m.loss_sum), static_cast<float>(m.correct),
                       static_cast<float>(m.samples), static_cast<float>(m.skipped)};
    if (!state_.counts_metrics()) std::fill(std::begin(totals), std::end(totals), 0.0f);
    world.AllReduceSum(totals, 4, pass + " metrics", config_.collective_timeout_s);
    m.loss_sum = totals[0];
    m.correct = std::llround(totals[1]);
    m.samples = std::llround(totals[2]);
    m.skipped = std::llround(totals[3]);
  }
  if (progress_ && !state_.bad_records.empty()) {
    std::string list;
    for (size_t i = 0; i < state_.bad_records.size() && i < 10; ++i)
      list += "\n  " + state_.bad_records[i];
    progress_->Line(StrCat("skipped ", state_.bad_records.size(), " bad record(s) in the ", pass,
                           " pass of epoch ", epoch + 1, ":", list,
                           state_.bad_records.size() > 10 ? "\n  ..." : ""));
  }
  return state_.metrics;
}

void Trainer::LogAutotune(const AutotuneDecision& d) {
  if (progress_) progress_->Line(d.ToString());
  if (autotune_log_) {
    std::ostringstream row;
    row << d.batch << "," << d.action << "," << d.knob << "," << d.from << "," << d.to << ","
        << d.rate_before << "," << d.rate_after << ",\"" << d.reason << "\"\n";
    WriteRunFiles([&] { autotune_log_->Append(row.str()); });
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

std::string Trainer::ResolvedConfigText() const {
  std::ostringstream os;
  for (const auto& o : config_.overrides) os << "# --set " << o << "\n";
  YAML::Emitter e;
  e << config_.doc.root();
  os << e.c_str() << "\n";
  return os.str();
}

namespace {

const std::vector<std::string> kMetricsColumns = {
    "epoch",   "train_loss", "train_accuracy", "test_loss", "test_accuracy", "images_per_s",
    "seconds", "lr",         "skipped_records"};

// A row's test loss and accuracy when the run has no test set: written as
// empty fields, not as a loss and an accuracy of 0.
constexpr double kNoTest = -1;

std::string MetricsRow(const std::vector<double>& v) {
  char test[64] = ",";
  if (v[3] != kNoTest) std::snprintf(test, sizeof test, "%.6f,%.6f", v[3], v[4]);
  char row[320];
  std::snprintf(row, sizeof row, "%lld,%.6f,%.6f,%s,%.1f,%.3f,%.6g,%lld",
                static_cast<long long>(v[0]), v[1], v[2], test, v[5], v[6], v[7],
                static_cast<long long>(v[8]));
  return row;
}

// steps.csv: a row every train.log_every steps (the train/* scalars), and
// one at each epoch's last step with its test loss and accuracy; a field a
// row does not have is empty.
const std::vector<std::string> kStepsColumns = {
    "step",          "epoch", "train_loss",   "train_accuracy",  "test_loss",
    "test_accuracy", "lr",    "images_per_s", "data_wait_share", "allreduce_share"};

std::string JoinCsv(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + v[i];
  return s;
}

// A steps.csv row from scalars named "train/<column>" or "<column>".
std::string StepsRow(int64_t step, int64_t epoch,
                     const std::vector<std::pair<std::string, double>>& scalars) {
  std::vector<std::string> fields(kStepsColumns.size());
  fields[0] = std::to_string(step);
  fields[1] = std::to_string(epoch);
  for (const auto& [tag, v] : scalars) {
    // train/loss -> train_loss, train/accuracy -> train_accuracy, train/lr -> lr, ...
    std::string column = tag;
    if (tag == "train/loss" || tag == "train/accuracy") {
      column[5] = '_';
    } else if (tag.rfind("train/", 0) == 0) {
      column = tag.substr(6);
    }
    for (size_t i = 2; i < kStepsColumns.size(); ++i) {
      if (kStepsColumns[i] == column) {
        char b[32];
        std::snprintf(b, sizeof b, "%.7g", v);
        fields[i] = b;
      }
    }
  }
  return JoinCsv(fields);
}

// Adds a segment's totals to a pass's.
void Accumulate(PassMetrics& total, const PassMetrics& part) {
  total.loss_sum += part.loss_sum;
  total.correct += part.correct;
  total.samples += part.samples;
  total.batches += part.batches;
  total.skipped += part.skipped;
  total.seconds += part.seconds;
}

// steps.csv of a resumed run: drops the rows of steps after `step` (the
// checkpoint's), which a run that died later had written and the resumed
// run writes again, so that each step keeps one row. Replaced in one rename.
void DropStepRowsAfter(const fs::path& csv, int64_t step) {
  std::ifstream in(csv);
  std::string text, line;
  if (std::getline(in, line)) text = line + "\n";  // the header
  while (std::getline(in, line)) {
    if (std::strtoll(line.c_str(), nullptr, 10) <= step) text += line + "\n";
  }
  in.close();
  WriteFileAtomically(csv.string(), text);
}

}  // namespace

std::pair<double, double> Trainer::StepCounters() const {
  if (!replicas_ || replicas_->device(0).is_cuda()) return {-1, 0};
  const ReplicaSet::Counters& c = replicas_->counters(0);
  return {c.compute_seconds + c.reduce_wait_seconds, c.reduce_wait_seconds};
}

void Trainer::LogStepScalars(int64_t step, const BatchMessage& m, const PassMetrics& p) {
  ScalarWindow& w = window_;
  const double seconds = w.seconds + (p.seconds - w.mark);
  const auto samples = static_cast<double>(w.samples);
  if (samples <= 0) return;
  std::vector<std::pair<std::string, double>> s = {
      {"train/loss", w.loss_sum / samples},
      {"train/accuracy", static_cast<double>(w.correct) / samples},
      {"train/lr", m.lr},
      {"train/images_per_s", seconds > 0 ? samples / seconds : 0}};
  // The step's busy time against the wall time, as `cnnflow bench` reports it.
  if (m.step_busy_seconds >= 0 && w.busy >= 0 && seconds > 0) {
    s.emplace_back("train/data_wait_share",
                   std::max(0.0, 1.0 - (m.step_busy_seconds - w.busy) / seconds));
    s.emplace_back("train/allreduce_share", (m.step_reduce_wait_seconds - w.reduce_wait) / seconds);
    w.busy = m.step_busy_seconds;
    w.reduce_wait = m.step_reduce_wait_seconds;
  }
  WriteRunFiles([&] {
    events_->Scalars(step, s);
    steps_csv_->Append(StepsRow(step, m.epoch + 1, s) + "\n");
  });
  w.seconds = 0;
  w.mark = p.seconds;
  w.loss_sum = 0;
  w.correct = 0;
  w.samples = 0;
}

void Trainer::Resume(const std::string& run_dir) {
  std::vector<std::string> warnings;
  std::optional<LoadedCheckpoint> ck = FindLatestCheckpoint(run_dir, &warnings);
  for (const auto& w : warnings)
    if (progress_) progress_->Line("resume: " + w);
  if (!ck) {
    throw Error(StrCat(run_dir, ": no valid checkpoint to resume from",
                       warnings.empty() ? "" : " (" + JoinNames(warnings) + ")"));
  }
  const CheckpointState& st = ck->state;
  if (st.config_hash != config_hash_) {
    throw ConfigError(StrCat(ck->sidecar_path, ": was written by a different config (hash ",
                             st.config_hash, ", this one is ", config_hash_,
                             "); resume with the same config and --set options (see ", run_dir,
                             "/config.yaml)"));
  }
  for (Model* m : Models()) CopyNamedTensors(ck->model_tensors, m->StateTensors(), ck->data_path);
  if (ema_) {
    auto it = st.extra.find("ema_updates");
    if (it == st.extra.end()) {
      throw Error(
          StrCat(ck->sidecar_path, ": has no weight average, but this graph has an ema node"));
    }
    ema_->Load(ck->model_tensors, std::stoll(it->second), ck->data_path);
  }
  for (Optimizer* opt : Optimizers()) {
    opt->LoadStateTensors(ck->optimizer_tensors);
    opt->set_step_count(st.optimizer_step);
  }
  start_epoch_ = st.epoch;
  batch_in_epoch_ = st.batch_in_epoch;
  state_.global_step = st.global_step;
  state_.batches_done = std::stoll(st.extra.at("batches_done"));
  metrics_rows_ = st.metrics_rows;
  partial_train_ = PassMetrics();
  if (auto it = st.extra.find("partial_train"); it != st.extra.end()) {
    std::istringstream in(it->second);
    in >> partial_train_.loss_sum >> partial_train_.correct >> partial_train_.samples >>
        partial_train_.batches >> partial_train_.skipped >> partial_train_.seconds;
  }
  // Mid-epoch, the train/* window goes on where it was (an epoch starts a new one).
  window_ = ScalarWindow();
  window_restored_ = st.batch_in_epoch > 0;
  if (auto it = st.extra.find("log_window"); it != st.extra.end() && window_restored_) {
    std::istringstream in(it->second);
    in >> window_.loss_sum >> window_.correct >> window_.samples;
  }
  run_dir_ = run_dir;
  resumed_ = true;
  checkpointed_step_ = st.global_step;
  if (progress_) {
    progress_->Line(StrCat("resuming ", ck->data_path, ": epoch ", st.epoch + 1, ", batch ",
                           st.batch_in_epoch, ", step ", st.global_step));
  }
}

void Trainer::SaveCheckpoint(int64_t epoch, const PassMetrics& partial) {
  if (state_.process_rank != 0) return;
  CheckpointState st;
  st.epoch = epoch;
  st.batch_in_epoch = batch_in_epoch_;
  st.global_step = state_.global_step;
  st.optimizer_step = Optimizers()[0]->step_count();
  st.lr_step = state_.global_step;
  st.seed = config_.seed;
  st.config_hash = config_hash_;
  st.extra["batches_done"] = std::to_string(state_.batches_done);
  std::ostringstream p;
  p.precision(17);
  p << partial.loss_sum << " " << partial.correct << " " << partial.samples << " "
    << partial.batches << " " << partial.skipped << " " << partial.seconds;
  st.extra["partial_train"] = p.str();
  std::ostringstream w;
  w.precision(17);
  w << window_.loss_sum << " " << window_.correct << " " << window_.samples;
  st.extra["log_window"] = w.str();
  st.metrics_columns = kMetricsColumns;
  st.metrics_rows = metrics_rows_;
  // Replicas hold identical state: replica 0's; pipeline stages: all.
  std::vector<std::pair<std::string, Tensor>> optimizer_state;
  for (Optimizer* opt : Optimizers()) {
    for (auto& t : opt->StateTensors()) optimizer_state.push_back(t);
    if (replicas_) break;
  }
  if (ema_) st.extra["ema_updates"] = std::to_string(ema_->updates());
  // A failed write (a full disk) leaves the earlier ones as they were
  // (pipeline/checkpoint.h).
  WriteRunFiles([&] {
    WriteCheckpoint(run_dir_, st, ExportedTensors(), optimizer_state,
                    static_cast<int>(config_.keep_checkpoints));
  });
  checkpointed_step_ = state_.global_step;
}

std::string Trainer::ResumeAdvice() const {
  if (checkpointed_step_ < 0) return "no checkpoint had been written yet: the run must start again";
  return StrCat("the checkpoints written before it are intact: --resume ", run_dir_,
                " continues from the newest (step ", checkpointed_step_, ")");
}

void Trainer::WriteRunFiles(const std::function<void()>& write) {
  try {
    write();
  } catch (const Error& e) {
    throw Error(StrCat(e.what(), "; ", ResumeAdvice()));
  }
}

EpochReport Trainer::Train(const std::string& run_dir) {
  const bool writer = state_.process_rank == 0;  // only rank 0 writes files
  if (!resumed_)
    run_dir_ = run_dir.empty() ? MakeRunDir(config_.output_dir, config_.name) : run_dir;
  if (progress_ && !resumed_ && !init_report_.empty()) progress_->Line(init_report_);
  std::unique_ptr<AppendFile> csv;
  if (writer) {
    fs::create_directories(run_dir_);
    const fs::path dir = run_dir_;
    WriteRunFiles([&] {
      if (!resumed_) {
        WriteFileAtomically((dir / "config.yaml").string(),
                            StrCat("# resolved config of run ", config_.name, " (from ",
                                   config_.doc.path(), ")\n", ResolvedConfigText()));
      }
      if (autotuner_) {
        autotune_log_ = std::make_unique<AppendFile>((dir / "autotune.csv").string(), !resumed_);
        if (!resumed_) {
          autotune_log_->Append(
              "batch,action,knob,from,to,images_per_s_before,images_per_s_after,reason\n");
        }
      }
      // metrics.csv: rebuilt from the checkpoint's rows on resume, in one
      // step, so a failure leaves the file as the last run left it.
      std::string rows = JoinCsv(kMetricsColumns) + "\n";
      for (const auto& r : metrics_rows_) rows += MetricsRow(r) + "\n";
      WriteFileAtomically((dir / "metrics.csv").string(), rows);
      csv = std::make_unique<AppendFile>((dir / "metrics.csv").string(), /*truncate=*/false);
      events_ = std::make_unique<TfEventWriter>(run_dir_);
      const fs::path steps = dir / "steps.csv";
      const bool fresh = !resumed_ || !fs::exists(steps);
      if (!fresh) DropStepRowsAfter(steps, state_.global_step);
      steps_csv_ = std::make_unique<AppendFile>(steps.string(), fresh);
      if (fresh) steps_csv_->Append(JoinCsv(kStepsColumns) + "\n");
    });
  }

  MemoryPool& pool = PoolFor(Device::Cpu());
  pool.ResetPeak();
  const Device device = model_->device();
  if (device.is_cuda()) PoolFor(device).ResetPeak();
  double train_seconds = 0;  // this run's training passes
  EpochReport report;
  // Optimizer steps between checkpoints, in batches (whole accumulation windows).
  const int64_t every = config_.checkpoint_every * config_.accumulate;
  for (int64_t epoch = start_epoch_; epoch < config_.epochs && !state_.stop_requested; ++epoch) {
    report.epoch = epoch + 1;
    PassMetrics train = partial_train_;
    partial_train_ = PassMetrics();
    if (!window_restored_) window_ = ScalarWindow();  // an epoch's first window starts with it
    window_restored_ = false;
    std::tie(window_.busy, window_.reduce_wait) = StepCounters();
    const auto [busy0, reduce0] = StepCounters();
    const double gpu_idle0 = replicas_ ? replicas_->counters(0).gpu_idle_seconds : 0;
    // The train pass, in segments that end at checkpoints.
    for (;;) {
      state_.start_batch = batch_in_epoch_;
      state_.stop_batch = every > 0 ? (batch_in_epoch_ / every + 1) * every : 0;
      const int64_t before = state_.batches_done;
      Accumulate(train, RunPass(config_.train_graph, "train", epoch));
      batch_in_epoch_ += state_.batches_done - before;
      state_.start_batch = state_.stop_batch = 0;
      if (batch_in_epoch_ >= state_.plan.batches()) break;
      SaveCheckpoint(epoch, train);  // mid-epoch: every N steps, or stopped by a signal
      if (state_.stop_requested) break;
    }
    report.train = train;
    train_seconds += train.seconds;
    report.lr = schedule_->At(std::max<int64_t>(state_.global_step - 1, 0));
    if (state_.stop_requested) break;
    batch_in_epoch_ = 0;
    const bool tested = state_.datasets.count("test") != 0;
    if (tested) {
      // On the averaged weights, with an ema node that says so.
      const bool averaged = ema_ && ema_eval_;
      if (averaged) ema_->Swap(*model_);
      report.test = RunPass(config_.eval_graph, "eval", epoch);
      if (averaged) ema_->Swap(*model_);
    }
    const std::vector<double> row = {
        static_cast<double>(report.epoch),
        report.train.mean_loss(),
        report.train.accuracy(),
        tested ? report.test.mean_loss() : kNoTest,
        tested ? report.test.accuracy() : kNoTest,
        report.train.seconds > 0 ? report.train.samples / report.train.seconds : 0,
        report.train.seconds,
        report.lr,
        static_cast<double>(report.train.skipped + report.test.skipped)};
    metrics_rows_.push_back(row);
    if (csv) WriteRunFiles([&] { csv->Append(MetricsRow(row) + "\n"); });
    if (events_) {
      std::vector<std::pair<std::string, double>> s = {{"epoch/train_loss", row[1]},
                                                       {"epoch/train_accuracy", row[2]}};
      if (tested) {
        s.emplace_back("epoch/test_loss", row[3]);
        s.emplace_back("epoch/test_accuracy", row[4]);
      }
      s.emplace_back("epoch/lr", row[7]);
      s.emplace_back("epoch/images_per_s", row[5]);
      const double wall = report.train.seconds;
      const auto [busy, reduce] = StepCounters();
      if (busy0 >= 0 && wall > 0) {
        s.emplace_back("epoch/data_wait_share", std::max(0.0, 1.0 - (busy - busy0) / wall));
        s.emplace_back("epoch/allreduce_share", (reduce - reduce0) / wall);
      } else if (replicas_ && device.is_cuda() && wall > 0) {  // the GPU idle between steps
        s.emplace_back("epoch/data_wait_share",
                       (replicas_->counters(0).gpu_idle_seconds - gpu_idle0) / wall);
      }
      WriteRunFiles([&] {
        events_->Scalars(report.epoch, s);
        if (tested) {
          steps_csv_->Append(StepsRow(state_.global_step, report.epoch,
                                      {{"test_loss", row[3]}, {"test_accuracy", row[4]}}) +
                             "\n");
        }
      });
    }
    SaveCheckpoint(epoch + 1, PassMetrics());
    if (progress_) {
      const std::string test =
          tested ? StrCat(", test loss ", report.test.mean_loss(), ", test accuracy ",
                          100 * report.test.accuracy(), "% of ", report.test.samples, " samples")
                 : StrCat(", train accuracy ", 100 * report.train.accuracy(), "% (no test set)");
      progress_->Line(StrCat("epoch ", report.epoch, "/", config_.epochs, ": train loss ",
                             report.train.mean_loss(), test, ", ",
                             static_cast<int64_t>(report.train.samples_per_second()), " img/s"));
    }
  }
  if (progress_) {
    progress_->Line(StrCat("peak memory: ", pool.peak_bytes_in_use() / 1000000, " MB in use, ",
                           pool.bytes_reserved() / 1000000, " MB held (host pool)"));
    if (device.is_cuda()) {
      MemoryPool& gpu = PoolFor(device);
      progress_->Line(StrCat("peak memory on ", device.ToString(), ": ",
                             gpu.peak_bytes_in_use() / 1000000, " MB in use, ",
                             gpu.bytes_reserved() / 1000000, " MB held"));
    }
    if (replicas_ && device.is_cuda() && train_seconds > 0) {
      const double idle = replicas_->counters(0).gpu_idle_seconds;
      progress_->Line(StrCat("GPU idle between steps (waiting for the host or the data): ",
                             static_cast<int>(100 * idle / train_seconds), "% of training time"));
    }
    if (replicas_ && replicas_->counters(0).skipped_steps > 0) {
      progress_->Line(StrCat("fp16 loss scaling skipped ", replicas_->counters(0).skipped_steps,
                             " steps with inf/NaN gradients"));
    }
  }
  if (writer) {
    SaveSafetensors(
        (fs::path(run_dir_) / "model.safetensors").string(), ExportedTensors(),
        {{"config", config_.name}, {"epochs", std::to_string(report.epoch)}, {"format", "pt"}});
  }
  return report;
}

std::vector<Model*> Trainer::Models() {
  if (pipeline_) return {&pipeline_->full()};  // the stages share its storage
  std::vector<Model*> v;
  for (int r = 0; r < replicas_->size(); ++r) v.push_back(&replicas_->model(r));
  return v;
}

std::vector<Optimizer*> Trainer::Optimizers() {
  std::vector<Optimizer*> v;
  if (pipeline_) {
    for (int s = 0; s < pipeline_->num_stages(); ++s) v.push_back(&pipeline_->optimizer(s));
  } else {
    for (int r = 0; r < replicas_->size(); ++r) v.push_back(&replicas_->optimizer(r));
  }
  return v;
}

std::vector<std::pair<std::string, Tensor>> Trainer::ExportedTensors() {
  std::vector<std::pair<std::string, Tensor>> out = model_->StateTensors();
  if (ema_) out.insert(out.end(), ema_->tensors().begin(), ema_->tensors().end());
  return out;
}

void Trainer::InitFromWeights() {
  const RunConfig::InitFrom& init = config_.init_from;
  const std::string& path = init.weights;
  StateDictRules rules;
  rules.strict = init.strict;
  rules.skip = init.skip;
  const SafetensorsFile file = LoadSafetensors(path);
  const StateDictMatch m = MatchStateDict(file.tensors, model_->StateTensors(), rules);
  if (!m.mismatches.empty()) {
    if (init.strict) {
      throw ConfigError(StrCat("train.init: ", path,
                               " does not fit the model (strict: true; "
                               "strict: false loads what fits, skip: [glob] leaves tensors "
                               "at their fresh initialisation):",
                               ListMismatches(m)));
    }
    init_report_ =
        StrCat("train.init: ", path, ": ", m.mismatches.size(),
               " tensors left at their fresh initialisation or ignored:", ListMismatches(m), "\n");
  }
  CopyStateDict(m, Models(), path);  // what fits, into every replica and pipeline stage
  init_report_ += StrCat("train.init: ", m.tensors.size(), " tensors from ", path);
}

void Trainer::LoadWeights(const std::string& path, const std::string& prefix) {
  StateDictRules rules;
  rules.prefix = prefix;
  LoadStateDict(LoadSafetensors(path).tensors, Models(), rules, path);
}

std::string Trainer::Describe() const {
  return ValidateReport(config_, *model_, replicas_.get(), pipeline_.get(), steps_per_epoch_);
}

}  // namespace cnnflow
