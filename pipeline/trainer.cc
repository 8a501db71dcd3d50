#include "pipeline/trainer.h"

#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <sstream>

#include "ops/cpu/parallel.h"
#include "ops/device_ops.h"
#include "ops/io/safetensors.h"
#include "ops/io/weights_file.h"
#include "ops/test_fault.h"
#include "pipeline/batch_loader.h"
#include "pipeline/checkpoint.h"
#include "pipeline/executor.h"
#include "pipeline/init_from_data.h"
#include "pipeline/kernel_picks.h"
#include "pipeline/validate_report.h"
#include "stages/pass_plan.h"

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

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

// The replicas (data parallel), or the pipeline's stages (graph.pipeline),
// each device getting an equal share of the thread budget.
void Trainer::BuildModel(MpiWorld& world) {
  const int replicas = static_cast<int>(config_.devices.size());
  // Under mpirun the processes of a node take the next GPUs in turn:
  // process k of a node with devices [cuda:0, cuda:1] takes cuda:2k, cuda:2k+1.
  std::vector<Device> devices = config_.devices;
  if (devices[0].is_cuda()) {
    for (Device& d : devices) {
      d.index += world.local_rank() * replicas;
      if (d.index >= CudaDeviceCount()) {
        throw ConfigError(StrCat(world.active() ? world.Where() : std::string("this process"),
                                 " would use ", d.ToString(), " but ", CudaDeviceCount(),
                                 " GPUs were found",
                                 CudaAvailable() ? "" : " (no usable GPU or CUDA driver)"));
      }
    }
  }
  if (config_.pipeline) {
    PipelineOptions po = config_.pipeline_options;
    if (po.stages.empty()) {  // stages: auto
      auto whole = Model::Build(config_.layers, config_.input_shape,
                                {.seed = config_.seed, .init = config_.init});
      po.stages = BalancedCut(*whole, replicas);
    }
    po.threads_per_stage = config_.threads / replicas;
    po.devices = devices;
    pipeline_ = std::make_unique<PipelineModel>(config_.layers, config_.input_shape, config_.seed,
                                                config_.init, config_.optimizer, po);
    model_ = &pipeline_->full();
  } else {
    DataParallelOptions dp = config_.data_parallel;
    dp.replicas = replicas;
    dp.threads_per_replica = config_.threads / replicas;
    dp.devices = devices;
    replicas_ = std::make_unique<ReplicaSet>(config_.layers, config_.input_shape, config_.seed,
                                             config_.init, config_.optimizer, dp, world);
    model_ = &replicas_->model(0);
  }
}

Trainer::Trainer(RunConfig config) : config_(std::move(config)) {
  run_.control = &control_;
  thread_limit_ = std::make_shared<tbb::global_control>(
      tbb::global_control::max_allowed_parallelism, static_cast<size_t>(config_.threads));
  arena_ = cpu::MakeComputeArena(config_.threads, config_.data_parallel.flush_denormals);

  MpiWorld& world = MpiWorld::Get();
  run_.process_rank = world.rank();
  run_.process_count = world.size();
  run_.collective_timeout_s = config_.data_parallel.timeout_s;
  world.SetStallWarning(config_.stall_warn_s);
  // The start-up's collectives wait graph.startup_timeout_s, not
  // collective_timeout_s: the config check below, the local replica counts
  // and the initial broadcasts of BuildModel, and the first training step's
  // (a rank may still be reading its data or building its primitives). The
  // optimizer stage ends it after that step (stages/optimizer.cc), RunPass
  // after a pass without one.
  MpiWorld::BeginStartup(config_.startup_timeout_s);
  MaybeSlowTestStart(kTestFaultAtStart);  // CNNFLOW_TEST_SLOW_START, for the start-up test
  const int replicas = static_cast<int>(config_.devices.size());
  if (config_.threads < replicas) {  // replicas block for each other: each needs a thread
    throw ConfigError(StrCat(config_.doc.path(), ": ", replicas, " replicas need at least ",
                             replicas, " threads (threads: ", config_.threads, ")"));
  }
  // Every process must run the same config (and so the same graph and
  // parameter shapes): a mismatch fails on every rank at once.
  const std::string config_hash = ConfigHash(ResolvedConfigText());
  if (world.active()) {
    world.AgreeOnHash(std::stoull(config_hash, nullptr, 16), "the resolved config",
                      config_.data_parallel.timeout_s);
  }

  // The model first: a shape error is reported before any data is read.
  BuildModel(world);
  CheckFreezeGlobs(config_.freeze, model_->NamedParameters());
  const std::vector<std::string> group_notes =
      CheckParamGroups(config_.optimizer.groups, model_->NamedParameters());
  OpenData();
  checkpoints_ = std::make_unique<CheckpointControl>(RunIdentityText(), config_.seed,
                                                     static_cast<int>(config_.keep_checkpoints));
  PlanSchedule();
  if (replicas_ && !replicas_->device(0).is_cuda()) ShareKernelPicks(world);
  TimeParamGroups();
  // `init: {weight: whiten}` and the like, once the training data is open:
  // where there is one, the timed span starts with it.
  const double init0 = SteadySeconds();
  init_report_ =
      InitFromData(config_, run_.dataset("train"), run_.transform, *model_, Tensors().models);
  if (!init_report_.empty()) whiten_seconds_ = SteadySeconds() - init0;
  for (const std::string& note : group_notes)
    init_report_ += StrCat(init_report_.empty() ? "" : "\n", "note: ", note);
  // Before the ema node's average starts from the model (a resume then
  // loads its checkpoint over both).
  if (!config_.init_from.weights.empty()) {
    const RunConfig::InitFrom& init = config_.init_from;
    init_report_ += StrCat(init_report_.empty() ? "" : "\n",
                           InitFromWeights(init.weights, init.strict, init.skip, Tensors().models));
  }

  HoldDataOnGpus();
  run_.replicas = replicas_.get();
  run_.pipeline = pipeline_.get();
  run_.model = model_;
  run_.accumulate = config_.accumulate;
  run_.schedule = schedule_.get();
  run_.seed = config_.seed;
  run_.threads = config_.threads;
  if (config_.autotune) autotuner_ = std::make_unique<Autotuner>();
  run_.label_smoothing = config_.label_smoothing;
  BuildWeightAverage();
}

Trainer::~Trainer() = default;

// The data sets, each normalising as it writes a sample; data.train's
// samples must fit the model's input, and its classes the model's output.
void Trainer::OpenData() {
  // The processes of a tensor-parallel group that spans processes share
  // one data shard.
  const int group_processes = replicas_ ? replicas_->tensor_parallel_processes() : 1;
  run_.data_rank = run_.process_rank / group_processes;
  run_.data_ranks = run_.process_count / group_processes;
  run_.replica_count = replicas_ ? replicas_->data_parallel() : 1;
  run_.replica_first =
      config_.logical_replicas > 0 ? config_.logical_first : run_.data_rank * run_.replica_count;
  run_.replicas_total = config_.logical_replicas > 0 ? config_.logical_replicas
                                                     : run_.data_ranks * run_.replica_count;
  for (const auto& set : config_.data) {
    run_.datasets[set.first] = OpenDataSet(config_, set.first, nullptr);
  }
  const Dataset& train = run_.dataset("train");
  if (train.sample_shape() != config_.input_shape) {
    throw ShapeError(StrCat(config_.doc.path(), ": model.input is ", config_.input_shape,
                            " but data.train (", train.description(), ") has samples of ",
                            train.sample_shape()));
  }
  if (!config_.normalize_mean.empty()) {
    run_.transform.AddNormalize(config_.normalize_mean, config_.normalize_std);
  }
  const Shape out = model_->output_shape();
  if (out.rank() != 1 || out[0] < train.num_classes()) {
    throw ShapeError(StrCat("the last layer '", model_->layer(model_->num_layers() - 1).name(),
                            "' produces ", out, ", but the loss needs [classes] with at least ",
                            train.num_classes(), " classes (data.train has ", train.num_classes(),
                            ")"));
  }
}

// On GPU replicas, the training set decoded once, held on each GPU and its
// batches made there; where it cannot be (a source or augmentation the GPU
// does not make, a set over half a GPU's free memory), the pinned-memory
// path, and one line says why. On CPU devices the key does nothing.
void Trainer::HoldDataOnGpus() {
  if (!config_.device_resident) return;
  auto note = [this](const std::string& line) {
    init_report_ += StrCat(init_report_.empty() ? "" : "\n", "data.device_resident: ", line);
  };
  if (!replicas_ || !model_->device().is_cuda()) {
    note(model_->device().is_cuda() ? "the training set stays on the host: a pipeline's first "
                                      "stage copies its micro-batches (the resident set feeds "
                                      "data-parallel replicas)"
                                    : "no effect on CPU devices (the data is in host memory "
                                      "already)");
    return;
  }
  for (const NodeSpec& node : config_.train_graph.nodes) {
    if (node.stage == "mixup" || node.stage == "cutmix") {
      note(StrCat("the training set stays on the pinned-memory path: the ", node.stage,
                  " stage mixes the batch's pixels on the host"));
      return;
    }
  }
  std::vector<Device> gpus;
  for (int r = 0; r < replicas_->size(); ++r) gpus.push_back(replicas_->device(r));
  const Dataset& train = run_.dataset("train");
  const ResidentData::Made made = ResidentData::Make(
      "train", train, train.normalizes() || config_.normalize_mean.empty(), gpus, config_.threads);
  if (!made.data) {
    note(StrCat("the training set stays on the pinned-memory path: ", made.why_not));
    return;
  }
  run_.resident = made.data;
  note(StrCat("the training set (", made.data->bytes() / 1000000, " MB as uint8) decoded in ",
              made.decode_seconds, " s, uploaded to ", gpus.size(), " GPU replica(s) in ",
              made.upload_seconds, " s; batches are made on the GPU"));
}

// Optimizer steps per epoch: the training set in global batches (the
// training graph's sampler's batch per replica, x the run's replicas: a user
// template's sampler may cut them otherwise than train.batch), accumulate
// batches a step; the
// LR schedule counts by them.
void Trainer::PlanSchedule() {
  const GraphPlan plan = config_.train_graph.Plan();
  if (plan.batch_samples <= 0) {
    throw ConfigError(StrCat(config_.train_graph.file, ": the train graph has no sampler"));
  }
  const Dataset& train = run_.dataset("train");
  const int64_t batch = plan.replica_batch * run_.replicas_total;  // over all processes
  steps_per_epoch_ = PassPlan(PassBatches(train.size(), batch, plan.drop_last, config_.max_steps),
                              config_.accumulate)
                         .steps();
  if (steps_per_epoch_ == 0 && plan.drop_last) {
    throw ConfigError(StrCat("data.train: its ", train.size(), " samples make no full batch of ",
                             batch,
                             ", and the short one is dropped (train.drop_last, or graph.sync_bn): "
                             "an epoch would train nothing; lower train.batch"));
  }
  const Args& s = config_.schedule_args;
  const int64_t global_batch = batch * config_.accumulate;
  LrScheduleOptions lr;
  lr.base_lr = config_.optimizer.args.Float("lr");
  if (s.String("scale_lr") == "linear") {
    const int64_t base_batch = s.Int("base_batch") > 0 ? s.Int("base_batch") : config_.batch;
    lr.base_lr = ScaleLr(lr.base_lr, global_batch, base_batch);
  }
  lr.decay = s.String("decay");
  // A fractional epoch count trains the first steps of the last epoch's
  // order (as a loop that breaks there), counted in whole optimizer steps.
  lr.total_steps = std::max<int64_t>(1, std::llround(config_.epochs * steps_per_epoch_));
  total_steps_ = lr.total_steps;
  passes_ = static_cast<int64_t>(std::ceil(config_.epochs));
  last_pass_batches_ = 0;
  if (steps_per_epoch_ > 0) {
    passes_ = (lr.total_steps + steps_per_epoch_ - 1) / steps_per_epoch_;
    const int64_t last_steps = lr.total_steps - (passes_ - 1) * steps_per_epoch_;
    if (last_steps < steps_per_epoch_) last_pass_batches_ = last_steps * config_.accumulate;
  }
  lr.warmup_steps = static_cast<int64_t>(std::llround(s.Float("warmup_epochs") * steps_per_epoch_));
  lr.step_size = static_cast<int64_t>(std::llround(s.Float("step_epochs") * steps_per_epoch_));
  lr.warmup_start_factor = s.Float("warmup_start_factor");
  lr.gamma = s.Float("gamma");
  lr.min_lr = s.Float("min_lr");
  for (double e : s.Floats("milestones")) lr.point_steps.push_back(e * steps_per_epoch_);
  lr.point_factors = s.Floats("factors");
  try {
    schedule_ = std::make_unique<LrSchedule>(lr);
  } catch (const ConfigError& e) {  // "schedule: ...", said where
    throw ConfigError(StrCat(config_.doc.path(), ": train.", e.what()));
  }
}

// Groups that train for some epochs only: their step limits, once the
// steps per epoch are known (the optimizers were made with the model).
void Trainer::TimeParamGroups() {
  bool timed = false;
  for (ParamGroup& g : config_.optimizer.groups) {
    if (g.until_epoch <= 0) continue;
    g.until_step = std::max<int64_t>(1, std::llround(g.until_epoch * steps_per_epoch_));
    timed = true;
  }
  if (!timed) return;
  for (Optimizer* o : Tensors().optimizers) o->AssignGroups(config_.optimizer.groups);
}

// The average an ema node of the train graph updates; the trainer keeps it
// (checkpoints, model.safetensors, evaluation).
void Trainer::BuildWeightAverage() {
  const std::optional<GraphPlan::WeightAveragePlan> plan =
      config_.train_graph.Plan().weight_average;
  if (plan) {
    if (!replicas_) {
      throw ConfigError(
          StrCat(plan->where, " averages data-parallel replicas; a pipeline has none"));
    }
    if (replicas_->tensor_parallel() > 1) {
      throw ConfigError(StrCat(plan->where, " does not combine with graph.tensor_parallel yet"));
    }
    WeightAverageSchedule s;
    s.every = plan->every;
    s.start_step = std::llround(plan->start_epoch * static_cast<double>(steps_per_epoch_));
    s.ramp_power = plan->ramp_power;
    s.total_steps = total_steps_;
    try {
      ema_ = std::make_unique<WeightAverage>(replicas_->model(0), plan->decay, plan->warmup, s);
    } catch (const ConfigError& e) {
      throw ConfigError(StrCat(plan->where, ": ", e.what()));
    }
    ema_eval_ = plan->eval;
    ema_lookahead_ = plan->lookahead;
  }
  run_.ema = ema_.get();
}

PassMetrics Trainer::RunPass(const GraphSpec& graph, const PassRequest& request) {
  const bool train = request.pass == "train";
  Autotuner* tuner = train ? autotuner_.get() : nullptr;
  std::map<std::string, int64_t> tuned;  // evaluation runs as configured
  if (tuner) {
    tuned = tuner->values();
    tuner->StartPass();
  }
  const Dataset& data = run_.dataset(train ? "train" : "test");
  pass_.reset(new PassState{
      .pass = request.pass,
      .epoch = request.epoch,
      .max_batches = request.max_batches >= 0 ? request.max_batches
                     : train                  ? config_.max_steps
                                              : config_.eval_max_steps,
      .start_batch = request.start_batch,
      .stop_batch = request.stop_batch,
      .global_step = at_.global_step,
      .batches_done = at_.batches_done,
      .batch_bytes = graph.Plan().batch_samples * data.sample_shape().numel() *
                     static_cast<int64_t>(sizeof(float)),
      .tuned = std::move(tuned),
      .on_batch =
          [this, tuner, observe = request.observe](const BatchMessage& m, PassState& pass) {
            if (observe) observe(m, pass.metrics);
            OnBatch(tuner, m, pass);
          },
  });
  PassState& pass = *pass_;
  const bool logged = files_ && train;
  if (logged) files_->StartSegment();
  if (pipeline_) pipeline_->StartPass();
  if (replicas_ && train) replicas_->StartPass();
  // In an arena of exactly the run's threads: replicas block while they wait
  // for each other, so each needs a thread of its own, even where `threads`
  // exceeds the cores (the default arena has one slot per core).
  arena_->execute([&] { RunGraph(graph, run_, pass); });
  if (pipeline_) pipeline_->Synchronize();  // before the host reads the weights and times
  MpiWorld::EndStartup();  // after a pass that had no training step (evaluation alone)
  if (progress_) progress_->EndPass();
  // Every batch must come out: one that does not is held by a node (a bug),
  // and would silently be missing from training.
  if (pass.metrics.batches != pass.sampled) {
    throw Error(StrCat("graph '", graph.name, "' of ", graph.file, " ended with ",
                       pass.sampled - pass.metrics.batches, " of ", pass.sampled,
                       " batches not delivered to its end"));
  }
  at_.global_step = pass.global_step;
  at_.batches_done = pass.batches_done;
  pass.metrics.skipped = static_cast<int64_t>(pass.bad_records.size());
  if (logged) files_->EndSegment(pass.metrics.seconds);
  if (train && pipeline_ && pass.metrics.batches > 0) ReportPipeline(pass);
  GatherMetrics(pass);
  ReportBadRecords(pass);
  return pass.metrics;
}

void Trainer::ReportPipeline(const PassState& pass) {
  std::string measured;
  for (double b : pipeline_->bubble())
    measured += StrCat(measured.empty() ? "" : ", ", static_cast<int>(100 * b + 0.5), "%");
  Say(StrCat("pipeline: ", pipeline_->num_stages(), " stages, ",
             config_.pipeline_options.microbatches, " micro-batches (",
             PipelineScheduleName(config_.pipeline_options.schedule), "): idle share per stage ",
             measured, "; theoretical bubble ",
             static_cast<int>(100 * pipeline_->theoretical_bubble() + 0.5), "%"));
  std::vector<double> busy_ms;
  std::vector<std::vector<std::string>> layers;
  for (int s = 0; s < pipeline_->num_stages(); ++s) {
    busy_ms.push_back(1e3 * pipeline_->busy_seconds()[s] /
                      static_cast<double>(pass.metrics.batches));
    layers.push_back(pipeline_->stage_layers(s));
  }
  if (const auto slow = FindSlowStage(busy_ms, layers)) Say(StrCat("pipeline: ", slow->Line()));
}

// In an MPI job each process trained or evaluated its shard: the pass's
// totals become the whole's (a shard that processes share counted once).
// Every process's totals are gathered and summed in rank order, so the
// counts stay exact integers and the loss is one f64 sum in a fixed order,
// the same on every rank (an f32 MPI_SUM rounded the loss to 24 bits, and
// would have rounded counts above 2^24).
void Trainer::GatherMetrics(PassState& pass) {
  MpiWorld& world = MpiWorld::Get();
  if (!world.active()) return;
  PassMetrics& m = pass.metrics;
  const bool counts = run_.counts_metrics();
  const double loss_sum = counts ? m.loss_sum : 0.0;
  uint64_t loss_bits;
  std::memcpy(&loss_bits, &loss_sum, sizeof loss_bits);
  auto gather = [&](uint64_t v, const char* what) {
    return world.AllGather(v, StrCat(pass.pass, " metrics (", what, ")"),
                           config_.data_parallel.timeout_s);
  };
  const auto losses = gather(loss_bits, "loss");
  const auto correct = gather(counts ? m.correct : 0, "correct");
  const auto samples = gather(counts ? m.samples : 0, "samples");
  const auto skipped = gather(counts ? m.skipped : 0, "skipped");
  m.loss_sum = 0;
  m.correct = m.samples = m.skipped = 0;
  for (int r = 0; r < world.size(); ++r) {
    double l;
    std::memcpy(&l, &losses[r], sizeof l);
    m.loss_sum += l;
    m.correct += static_cast<int64_t>(correct[r]);
    m.samples += static_cast<int64_t>(samples[r]);
    m.skipped += static_cast<int64_t>(skipped[r]);
  }
}

void Trainer::ReportBadRecords(const PassState& pass) {
  const std::vector<std::string>& bad = pass.bad_records;
  if (bad.empty()) return;
  std::string list;
  for (size_t i = 0; i < bad.size() && i < 10; ++i) list += "\n  " + bad[i];
  Say(StrCat("skipped ", bad.size(), " bad record(s) in the ", pass.pass, " pass of epoch ",
             pass.epoch + 1, ":", list, bad.size() > 10 ? "\n  ..." : ""));
}

void Trainer::OnBatch(Autotuner* tuner, const BatchMessage& m, PassState& pass) {
  const PassMetrics& p = pass.metrics;
  const bool train = pass.training();
  if (batch_observer_ && train) batch_observer_(m, p);
  if (files_ && train) {  // as the metrics stage adds to p
    files_->AddBatch(m.loss, m.correct, static_cast<int64_t>(m.labels.size()));
    if (config_.log_every > 0 && !m.dropped && pass.plan.EndsWindow(m.index) &&
        (m.global_step + 1) % config_.log_every == 0) {
      checkpoints_->Guard([&] {
        files_->StepScalars(m.global_step + 1, m.epoch + 1, m.lr, m.step_busy_seconds,
                            m.step_reduce_wait_seconds, p.seconds);
      });
    }
  }
  if (tuner) {
    for (const AutotuneDecision& d :
         tuner->Observe(pass.knobs, p.samples, p.seconds, m.step_busy_seconds)) {
      Say(d.ToString());
      if (files_) checkpoints_->Guard([&] { files_->Autotune(d); });
    }
  }
  if (progress_ == nullptr) return;
  progress_->Batch(pass.pass, pass.epoch + 1, passes_, m.index + 1, pass.plan.batches(),
                   p.mean_loss(), p.accuracy(), p.samples_per_second(), p.seconds);
}

PassMetrics Trainer::Evaluate() {
  if (run_.datasets.count("test") == 0) throw ConfigError("no data.test set to evaluate on");
  // `cnnflow eval` covers the whole test set.
  return RunPass(config_.eval_graph,
                 {.pass = "eval", .epoch = pass_ ? pass_->epoch : 0, .max_batches = 0});
}

std::string Trainer::ResolvedConfigText() const {
  std::ostringstream os;
  for (const auto& o : config_.overrides) os << "# --set " << o << "\n";
  YAML::Emitter e;
  e << config_.doc.root();
  os << e.c_str() << "\n";
  return os.str();
}

// The kernel picks of rank 0 for every process (pipeline/kernel_picks.h), at
// the rows each training step and evaluation gives a replica.
void Trainer::ShareKernelPicks(MpiWorld& world) {
  const GraphPlan plan = config_.train_graph.Plan();
  std::vector<int64_t> sizes = ReplicaBatchSizes(run_.dataset("train").size(), plan.replica_batch,
                                                 run_.replicas_total, plan.drop_last);
  if (run_.datasets.count("test")) {
    const std::vector<int64_t> eval =
        EvalBatchSizes(run_.dataset("test").size(), config_.eval_graph.Plan().batch_samples,
                       config_.batch, run_.data_ranks);
    sizes.insert(sizes.end(), eval.begin(), eval.end());
  }
  cnnflow::ShareKernelPicks(replicas_->model(0), sizes, world, config_.data_parallel.timeout_s);
}

// What a checkpoint belongs to: the resolved config less what does not
// change the result (the layout: graph.devices, threads, the number of
// processes; the collectives' deadlines), with the run's replica count
// (graph.logical_replicas) resolved. A resume must match it.
std::string Trainer::RunIdentityText() const {
  YAML::Node root = YAML::Clone(config_.doc.root());
  root.remove("threads");
  if (!root["graph"].IsMap()) root["graph"] = YAML::Node(YAML::NodeType::Map);
  for (const char* key : {"devices", "collective_timeout_s", "startup_timeout_s", "stall_warn_s"})
    root["graph"].remove(key);
  root["graph"]["logical_replicas"] = run_.replicas_total;
  YAML::Emitter e;
  e << root;
  return std::string(e.c_str()) + "\n";
}

std::pair<double, double> Trainer::StepCounters() const {
  if (!replicas_ || replicas_->device(0).is_cuda()) return {-1, 0};
  const ReplicaSet::Counters& c = replicas_->counters(0);
  return {c.compute_seconds() + c.reduce_wait_seconds, c.reduce_wait_seconds};
}

void Trainer::Resume(const std::string& run_dir) {
  at_ = checkpoints_->Resume(run_dir, Tensors(), [this](const std::string& l) { Say(l); });
  run_dir_ = run_dir;
  resumed_ = true;
}

void Trainer::SaveCheckpoint(int64_t epoch, const PassMetrics& partial) {
  if (run_.process_rank != 0) return;
  at_.epoch = epoch;
  at_.partial_train = partial;
  at_.metrics_rows = files_->metrics_rows();
  at_.log_window = files_->WindowState();
  checkpoints_->Save(run_dir_, at_, Tensors());
}

EpochReport Trainer::Train(const std::string& run_dir) {
  if (!resumed_) {
    run_dir_ = run_dir.empty() ? MakeRunDir(config_.output_dir, config_.name) : run_dir;
    if (!init_report_.empty()) Say(init_report_);
  }
  // graph.deterministic on GPUs: the cuDNN picks in the run folder, those of
  // the run resumed loaded first (ops/cuda/cudnn_picks.h); process 0 writes.
  if (config_.data_parallel.gpu_math.deterministic && model_->device().is_cuda()) {
    SetGpuPicksFile((fs::path(run_dir_) / "cudnn-picks.tsv").string(), run_.process_rank == 0);
  }
  if (run_.process_rank == 0) {  // only process 0 writes files
    checkpoints_->Guard([&] {
      files_ = std::make_unique<RunFiles>(
          run_dir_,
          StrCat("# resolved config of run ", config_.name, " (from ", config_.doc.path(), ")\n",
                 ResolvedConfigText()),
          autotuner_ != nullptr, resumed_ ? std::optional<int64_t>(at_.global_step) : std::nullopt,
          at_.metrics_rows, at_.batch_in_epoch > 0 ? at_.log_window : "");
    });
  }
  MemoryPool& pool = PoolFor(Device::Cpu());
  pool.ResetPeak();
  ResetGpuPoolPeaks(GpuLanes());
  double train_seconds = 0;  // this run's training passes
  EpochReport report;
  span_start_ = span_end_ = SteadySeconds();
  for (int64_t epoch = at_.epoch; epoch < passes_ && !control_.stop_requested; ++epoch) {
    report.epoch = epoch + 1;
    const auto [busy0, reduce0] = StepCounters();
    if (files_) files_->StartEpoch(busy0, reduce0);
    const double gpu_idle0 = replicas_ ? replicas_->counters(0).gpu_idle_seconds : 0;
    if (replicas_) rank_times_.Start(*replicas_);
    report.train = TrainEpoch(epoch);
    span_end_ = SteadySeconds();
    train_seconds += report.train.seconds;
    report.lr = schedule_->At(std::max<int64_t>(at_.global_step - 1, 0));
    if (control_.stop_requested) break;
    at_.batch_in_epoch = 0;
    FinishEpoch(epoch, report, busy0, reduce0, gpu_idle0);
  }
  ReportMemory(train_seconds);
  ReportTimedSpan();
  // Lookahead ends on the average (the last steps since its last update
  // are folded away), as the speed runs' final update does.
  if (ema_ && ema_lookahead_ && !control_.stop_requested) {
    for (int r = 0; r < replicas_->size(); ++r) ema_->CopyTo(replicas_->model(r));
  }
  if (files_) {
    SaveSafetensors(
        (fs::path(run_dir_) / "model.safetensors").string(), Tensors().Exported(),
        {{"config", config_.name}, {"epochs", std::to_string(report.epoch)}, {"format", "pt"}});
  }
  files_.reset();
  return report;
}

PassMetrics Trainer::TrainEpoch(int64_t epoch) {
  int64_t cut = config_.max_steps;
  if (epoch + 1 == passes_ && last_pass_batches_ > 0) {
    cut = config_.max_steps > 0 ? std::min(config_.max_steps, last_pass_batches_)
                                : last_pass_batches_;
  }
  PassMetrics train = at_.partial_train;
  at_.partial_train = PassMetrics();
  // Optimizer steps between checkpoints, in batches (whole accumulation windows).
  const int64_t every = config_.checkpoint_every * config_.accumulate;
  for (;;) {
    const int64_t before = at_.batches_done;
    const PassMetrics part =
        RunPass(config_.train_graph,
                {.pass = "train",
                 .epoch = epoch,
                 .max_batches = cut,
                 .start_batch = at_.batch_in_epoch,
                 .stop_batch = every > 0 ? (at_.batch_in_epoch / every + 1) * every : 0});
    train.Merge(part);
    train.seconds += part.seconds;
    at_.batch_in_epoch += at_.batches_done - before;
    if (at_.batch_in_epoch >= pass_->plan.batches()) break;
    SaveCheckpoint(epoch, train);  // mid-epoch: every N steps, or stopped by a signal
    if (control_.stop_requested) break;
  }
  return train;
}

void Trainer::FinishEpoch(int64_t epoch, EpochReport& report, double busy0, double reduce0,
                          double gpu_idle0) {
  // Every process gathers, before the evaluation's gathers.
  const std::optional<RankReport> ranks =
      replicas_ ? rank_times_.Finish(*replicas_, MpiWorld::Get(), config_.data_parallel.timeout_s)
                : std::nullopt;
  if (ranks) MpiWorld::Get().SetStallWarning(StallWarnSeconds(config_.stall_warn_s, ranks->ranks));
  const bool has_test = run_.datasets.count("test") != 0;
  const bool tested = has_test && (epoch + 1 == passes_ || (epoch + 1) % config_.eval_every == 0);
  if (tested) {
    // On the averaged weights, with an ema node that says so.
    const bool averaged = ema_ && ema_eval_;
    if (averaged) ema_->Swap(*model_);
    report.test = RunPass(config_.eval_graph, {.pass = "eval", .epoch = epoch});
    span_end_ = SteadySeconds();  // the pass has its accuracy: the GPUs are done
    if (averaged) ema_->Swap(*model_);
  }
  if (files_) {
    EpochRecord r;
    r.epoch = report.epoch;
    r.global_step = at_.global_step;
    r.train = report.train;
    if (tested) r.test = report.test;
    r.lr = report.lr;
    if (ranks) r.ranks = ranks->spread;
    const double wall = report.train.seconds;
    const auto [busy, reduce] = StepCounters();
    if (busy0 >= 0 && wall > 0) {
      r.data_wait_share = std::max(0.0, 1.0 - (busy - busy0) / wall);
      r.allreduce_share = (reduce - reduce0) / wall;
    } else if (replicas_ && model_->device().is_cuda() && wall > 0) {
      // The GPU idle between steps.
      r.data_wait_share = (replicas_->counters(0).gpu_idle_seconds - gpu_idle0) / wall;
    }
    checkpoints_->Guard([&] { files_->Epoch(r); });
  }
  SaveCheckpoint(epoch + 1, PassMetrics());
  const std::string test =
      tested ? StrCat(", test loss ", report.test.mean_loss(), ", test accuracy ",
                      100 * report.test.accuracy(), "% of ", report.test.samples, " samples")
             : StrCat(", train accuracy ", 100 * report.train.accuracy(), "% (",
                      has_test ? StrCat("evaluated every ", config_.eval_every, " epochs")
                               : std::string("no test set"),
                      ")");
  Say(StrCat("epoch ", report.epoch, "/", passes_, ": train loss ", report.train.mean_loss(), test,
             ", ", static_cast<int64_t>(report.train.samples_per_second()), " img/s"));
  if (ranks) Say(ranks->Text());
  if (epoch_observer_) epoch_observer_(report);
}

std::vector<GpuLane> Trainer::GpuLanes() const {
  std::vector<GpuLane> lanes;
  for (int r = 0; replicas_ && r < replicas_->size(); ++r)
    lanes.push_back({replicas_->device(r), replicas_->lane(r)});
  for (int s = 0; pipeline_ && s < pipeline_->num_stages(); ++s)
    lanes.push_back({pipeline_->device(s), pipeline_->lane(s)});
  return lanes;
}

// Peak memory, the GPU's idle share and fp16's skipped steps, at the end.
void Trainer::ReportMemory(double train_seconds) {
  if (progress_ == nullptr) return;
  MemoryPool& pool = PoolFor(Device::Cpu());
  Say(StrCat("peak memory: ", pool.peak_bytes_in_use() / 1000000, " MB in use, ",
             pool.bytes_reserved() / 1000000, " MB held (host pool)"));
  const Device device = model_->device();
  const std::vector<GpuPoolUse> gpus = MeasureGpuPools(GpuLanes());
  // Beside what validate predicts (data-parallel replicas only).
  const std::vector<GpuMemoryEstimate> predicted =
      gpus.empty()
          ? std::vector<GpuMemoryEstimate>()
          : EstimateGpuMemory(config_, *model_,
                              run_.resident ? static_cast<int64_t>(run_.resident->bytes()) : 0);
  for (size_t k = 0; k < gpus.size(); ++k) {
    const std::string guess =
        k < predicted.size()
            ? StrCat(" (predicted ~", static_cast<int64_t>(predicted[k].peak_mb), " MB)")
            : std::string();
    Say(StrCat("peak memory on ", gpus[k].device.ToString(), ": ", gpus[k].peak_in_use / 1000000,
               " MB in use", guess, ", ", gpus[k].held / 1000000, " MB held"));
  }
  if (replicas_ && device.is_cuda() && train_seconds > 0) {
    const double idle = replicas_->counters(0).gpu_idle_seconds;
    Say(StrCat("GPU idle between steps (waiting for the host or the data): ",
               static_cast<int>(100 * idle / train_seconds), "% of training time"));
  }
  if (const std::string graphs = DescribeCudaGraphRun(config_, replicas_.get()); !graphs.empty())
    Say(graphs);
  if (replicas_ && replicas_->counters(0).skipped_steps > 0) {
    Say(StrCat("fp16 loss scaling skipped ", replicas_->counters(0).skipped_steps,
               " steps with inf/NaN gradients"));
  }
}

// airbench's timed span: from the start of the whitening init (else of the
// first training pass) to the end of the last evaluation (else of the last
// training pass). Outside it: the data's decode and upload to the GPUs
// (data.device_resident), building the model and the run folder. Inside:
// whatever the passes do, the first steps' one-time work included (cuDNN's
// algorithm search, autotune, the loader's JPEG decode where the data is
// not resident). Fresh, complete runs only: a resumed or stopped run's
// span would not be the run's.
void Trainer::ReportTimedSpan() {
  if (resumed_ || control_.stop_requested || at_.global_step == 0) return;
  const double loop = span_end_ - span_start_;
  const bool whitened = whiten_seconds_ >= 0;
  const bool evaluated = run_.datasets.count("test") != 0;
  char figures[96];
  std::snprintf(figures, sizeof figures, "%.2f s", (whitened ? whiten_seconds_ : 0) + loop);
  std::string line = StrCat("timed span: ", figures, " from the ",
                            whitened ? "whitening init" : "first training pass", " to the end of ",
                            evaluated ? "the last evaluation" : "training");
  if (whitened) {
    std::snprintf(figures, sizeof figures, " (the init %.2f s)", whiten_seconds_);
    line += figures;
  }
  Say(line);
}

TrainedTensors Trainer::Tensors() {
  TrainedTensors t;
  if (pipeline_) {
    t.models = {&pipeline_->full()};  // the stages share its storage
    for (int s = 0; s < pipeline_->num_stages(); ++s)
      t.optimizers.push_back(&pipeline_->optimizer(s));
    t.optimizers_identical = false;
  } else {
    for (int r = 0; r < replicas_->size(); ++r) {
      t.models.push_back(&replicas_->model(r));
      t.optimizers.push_back(&replicas_->optimizer(r));
    }
  }
  t.ema = ema_.get();
  return t;
}

void Trainer::LoadWeights(const std::string& path, const std::string& prefix) {
  StateDictRules rules;
  rules.prefix = prefix;
  LoadStateDict(LoadWeightsFile(path).tensors, Tensors().models, rules, path);
}

std::string Trainer::Describe() const {
  return ValidateReport(config_, *model_, replicas_.get(), pipeline_.get(), steps_per_epoch_);
}

}  // namespace cnnflow
