#include "ops/parallel/pipeline_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <map>

#include "ops/collectives/collective_mpi.h"
#include "ops/cpu/parallel.h"
#include "ops/loss.h"
#include "ops/stream_event.h"

namespace cnnflow {

PipelineSchedule ParsePipelineSchedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::kGpipe;
  if (name == "1f1b") return PipelineSchedule::kOneFOneB;
  throw ConfigError(StrCat("unknown pipeline schedule '", name, "'; known: gpipe, 1f1b"));
}

const char* PipelineScheduleName(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::kGpipe ? "gpipe" : "1f1b";
}

std::vector<PipelineAction> StageSchedule(PipelineSchedule schedule, int stage, int stages,
                                          int microbatches) {
  std::vector<PipelineAction> a;
  const int m = microbatches;
  if (schedule == PipelineSchedule::kGpipe) {
    for (int i = 0; i < m; ++i) a.push_back({true, i});
    for (int i = 0; i < m; ++i) a.push_back({false, i});
    return a;
  }
  const int warmup = std::min(stages - stage - 1, m);
  for (int i = 0; i < warmup; ++i) a.push_back({true, i});
  for (int i = 0; i < m - warmup; ++i) {
    a.push_back({true, warmup + i});
    a.push_back({false, i});
  }
  for (int i = m - warmup; i < m; ++i) a.push_back({false, i});
  return a;
}

std::vector<bool> CutPoints(const Model& model) {
  const int n = model.num_layers();
  std::vector<bool> ok(n, false);
  int reach = n;  // the lowest layer (-1: the input) that layer p or a later one reads
  for (int p = n - 1; p >= 1; --p) {
    for (int in : model.input_indices(p)) reach = std::min(reach, in);
    ok[p] = reach >= p - 1;
  }
  return ok;
}

std::vector<std::vector<std::string>> BalancedCut(const Model& model, int stages) {
  const int n = model.num_layers();
  CNNFLOW_ENFORCE(stages >= 1 && stages <= n, "cannot cut ", n, " layers into ", stages, " stages");
  const std::vector<bool> cuttable = CutPoints(model);
  const int points = static_cast<int>(std::count(cuttable.begin(), cuttable.end(), true));
  if (points < stages - 1) {
    throw ConfigError(StrCat("graph.pipeline.stages: auto cannot cut this model into ", stages,
                             " stages: it has ", points,
                             " place(s) where one tensor crosses a cut (between residual "
                             "blocks); use at most ",
                             points + 1, " stages, or list them"));
  }
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i)
    prefix[i + 1] = prefix[i] + static_cast<double>(model.layer(i).ForwardFlops(1));
  // best[s][i]: the smallest possible largest stage cost of layers [0, i) in s stages.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s) {
    for (int i = s; i <= n; ++i) {
      for (int j = s - 1; j < i; ++j) {
        if (j > 0 && !cuttable[j]) continue;
        const double c = std::max(best[s - 1][j], prefix[i] - prefix[j]);
        if (c < best[s][i]) {
          best[s][i] = c;
          cut[s][i] = j;
        }
      }
    }
  }
  std::vector<std::vector<std::string>> out(stages);
  for (int s = stages, i = n; s > 0; --s) {
    const int j = cut[s][i];
    for (int k = j; k < i; ++k) out[s - 1].push_back(model.layer(k).name());
    i = j;
  }
  return out;
}

namespace {

// A batch's mean loss over its micro-batches, each coming back from the
// last stage's GPU (ops/device_ops.h's SoftmaxCrossEntropyAsync).
class MicroBatchLosses final : public PendingLoss {
 public:
  void Add(std::shared_ptr<PendingLoss> loss, int64_t rows) { parts_.push_back({loss, rows}); }
  bool ready() const override {
    return std::all_of(parts_.begin(), parts_.end(), [](const Part& p) { return p.loss->ready(); });
  }
  LossResult Get() override {
    LossResult total;
    int64_t rows = 0;
    double sum = 0;
    for (const Part& p : parts_) {
      const LossResult r = p.loss->Get();
      sum += r.loss * static_cast<double>(p.rows);
      total.correct += r.correct;
      rows += p.rows;
    }
    total.loss = rows > 0 ? sum / static_cast<double>(rows) : 0;
    return total;
  }

 private:
  struct Part {
    std::shared_ptr<PendingLoss> loss;
    int64_t rows;
  };
  std::vector<Part> parts_;
};

}  // namespace

struct PipelineModel::Stage {
  Device device;
  int lane = 0;                               // of its GPU (ops/device.h)
  std::vector<std::unique_ptr<Model>> slots;  // one per micro-batch held at once
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<tbb::task_arena> arena;
  std::vector<Tensor> out;      // per micro-batch: this stage's output
  std::vector<Tensor> dx;       // per micro-batch: gradient of this stage's input
  std::vector<Tensor> dlogits;  // last stage: the loss gradient
  std::vector<Tensor> labels;   // last stage on a GPU: the micro-batch's labels there
  // GPUs: where the stream has written out[i] and dx[i], for the
  // neighbouring stage's lane to wait for.
  std::vector<std::unique_ptr<StreamEvent>> out_ready, dx_ready;
  // The neighbour's gradients this stage copied into its lane, kept until
  // the copy has run (ops/stream_event.h).
  std::deque<std::pair<Tensor, std::unique_ptr<StreamEvent>>> retired;
  std::unique_ptr<IdleMeter> meter;  // GPUs: the stream's busy and idle time
  Tensor flat_grads;                 // the gradients being summed over processes
  MpiRequest gradient_sum;
  double busy = 0;  // CPUs: the host's time in the stage's actions
  int held = 0, max_held = 0;

  bool gpu() const { return device.is_cuda(); }
  // Lets go of the retired tensors whose copies have run.
  void DropCopied() {
    while (!retired.empty() && retired.front().second->passed()) retired.pop_front();
  }
};

namespace {

// Makes `to` use `from`'s parameter, gradient and buffer storage.
void ShareStorage(Layer& to, Layer& from) {
  for (size_t p = 0; p < to.parameters().size(); ++p) {
    to.parameters()[p].value = from.parameters()[p].value;
    to.parameters()[p].grad = from.parameters()[p].grad;
  }
  for (size_t b = 0; b < to.buffers().size(); ++b) to.buffers()[b].value = from.buffers()[b].value;
}

// Copies `from`'s parameter and buffer values into `to` (another device),
// and zeroes `to`'s gradients.
void CopyValues(Layer& to, Layer& from) {
  for (size_t p = 0; p < to.parameters().size(); ++p) {
    to.parameters()[p].value.CopyFrom(from.parameters()[p].value);
    to.parameters()[p].grad.Zero();
  }
  for (size_t b = 0; b < to.buffers().size(); ++b)
    to.buffers()[b].value.CopyFrom(from.buffers()[b].value);
}

// Each layer's stage, from a cut that must be contiguous, complete and in
// the model's order (else a ConfigError saying where it is not).
std::map<std::string, int> StageOfLayers(const Model& full,
                                         const std::vector<std::vector<std::string>>& stages) {
  std::map<std::string, int> index, stage_of;
  for (int i = 0; i < full.num_layers(); ++i) index[full.layer(i).name()] = i;
  int next = 0;
  for (int s = 0; s < static_cast<int>(stages.size()); ++s) {
    if (stages[s].empty()) throw ConfigError(StrCat("pipeline stage ", s, " has no layers"));
    for (const std::string& name : stages[s]) {
      auto it = index.find(name);
      if (it == index.end())
        throw ConfigError(StrCat("pipeline stage ", s, ": no layer '", name, "'"));
      if (it->second != next) {
        throw ConfigError(StrCat("pipeline stage ", s, ": layer '", name,
                                 "' is out of order; stages "
                                 "must list the model's layers in order, each once (expected '",
                                 next < full.num_layers() ? full.layer(next).name() : "nothing",
                                 "')"));
      }
      stage_of[name] = s;
      ++next;
    }
  }
  if (next != full.num_layers()) {
    throw ConfigError(StrCat("pipeline stages leave out layer '", full.layer(next).name(),
                             "' and after; every layer must be in a stage"));
  }
  return stage_of;
}

}  // namespace

PipelineModel::PipelineModel(const std::vector<LayerSpec>& layers, const Shape& input_shape,
                             uint64_t seed, InitScheme init, const OptimizerSpec& optimizer,
                             PipelineOptions options)
    : options_(std::move(options)) {
  const int num_stages = static_cast<int>(options_.stages.size());
  if (num_stages < 1) throw ConfigError("a pipeline needs at least one stage");
  if (options_.devices.empty()) options_.devices.assign(num_stages, Device::Cpu());
  CNNFLOW_ENFORCE(static_cast<int>(options_.devices.size()) == num_stages, num_stages,
                  " pipeline stages but ", options_.devices.size(), " devices");
  // The full model on stage 0's device, lane 0: checkpoints read it there.
  const Device home = options_.devices[0];
  SetGpuMath(home, options_.gpu_math);
  auto built_on = [&](Device d) {  // the options of every model of the pipeline
    return ModelOptions{.seed = seed,
                        .init = init,
                        .device = d,
                        .compute = options_.compute,
                        .fuse_activations = options_.fuse_activations};
  };
  full_ = Model::Build(layers, input_shape, built_on(home));
  full_->ZeroGrad();
  CNNFLOW_ENFORCE(options_.microbatches >= 1, "microbatches must be >= 1, got ",
                  options_.microbatches);
  const std::map<std::string, int> stage_of = StageOfLayers(*full_, options_.stages);
  const int m = options_.microbatches;
  for (int s = 0, first = 0; s < num_stages; ++s) {
    const int count = static_cast<int>(options_.stages[s].size());
    std::vector<LayerSpec> specs(layers.begin() + first, layers.begin() + first + count);
    for (size_t k = 0; k < specs.size(); ++k) {
      for (std::string& in : specs[k].inputs) {
        // The stage's input: the previous stage's last output (read by any
        // of its layers: a residual block's first conv and its add), or
        // the model input in the first stage.
        if (s > 0 && in == layers[first - 1].name) {
          in = kModelInput;
          continue;
        }
        if (s == 0 && in == kModelInput) continue;
        if (stage_of.count(in) == 0 || stage_of.at(in) != s) {
          throw ConfigError(StrCat("pipeline stage ", s, ": layer '", specs[k].name, "' reads '",
                                   in,
                                   "' from another stage; only the previous stage's last output "
                                   "crosses a cut"));
        }
      }
    }
    // Every input of the first layer is the stage's input (a multi-input
    // first layer, e.g. `concat` of [x, x], keeps its count).
    for (std::string& in : specs[0].inputs) in = kModelInput;
    const Shape in_shape = first == 0 ? input_shape : full_->output_shape(first - 1);
    auto stage = std::make_unique<Stage>();
    stage->device = options_.devices[s];
    for (int j = 0; j < s; ++j) stage->lane += options_.devices[j] == stage->device ? 1 : 0;
    const GpuLaneScope lane(stage->lane);  // its models, optimizer state and events in its lane
    SetGpuMath(stage->device, options_.gpu_math);
    const int slots =
        options_.schedule == PipelineSchedule::kGpipe ? m : std::min(m, num_stages - s);
    for (int k = 0; k < slots; ++k) {
      auto model = Model::Build(specs, in_shape, built_on(stage->device));
      for (int l = 0; l < model->num_layers(); ++l) {
        Layer& mine = model->layer(l);
        Layer& theirs = full_->layer(first + l);
        // A stage on another GPU than the full model's holds its own
        // storage, which the full model then points at.
        if (k == 0 && stage->device != home) {
          CopyValues(mine, theirs);
          ShareStorage(theirs, mine);
        }
        ShareStorage(mine, theirs);
      }
      stage->slots.push_back(std::move(model));
    }
    stage->optimizer = MakeOptimizer(optimizer, stage->slots[0]->NamedParameters());
    stage->arena = cpu::MakeComputeArena(options_.threads_per_stage, options_.flush_denormals);
    stage->meter = MakeIdleMeter(stage->device);
    stages_.push_back(std::move(stage));
    first += count;
  }
}

PipelineModel::~PipelineModel() {
  try {
    Synchronize();  // no lane still reads a tensor that goes with the stages
  } catch (...) {
  }
}

Optimizer& PipelineModel::optimizer(int s) { return *stages_[s]->optimizer; }
Model& PipelineModel::stage_model(int s) { return *stages_[s]->slots[0]; }
Device PipelineModel::device(int s) const { return stages_[s]->device; }
int PipelineModel::lane(int s) const { return stages_[s]->lane; }

int PipelineModel::BeginStep(const Tensor& x, const int64_t* labels, const ForwardContext& ctx,
                             double grad_scale, double label_smoothing) {
  step_begin_ = std::chrono::steady_clock::now();
  x_ = x;
  labels_ = labels;
  ctx_ = ctx;
  grad_scale_ = grad_scale;
  label_smoothing_ = label_smoothing;
  const int64_t n = x.dim(0);
  m_ = static_cast<int>(std::min<int64_t>(options_.microbatches, n));
  begin_.assign(m_ + 1, 0);
  for (int i = 0; i <= m_; ++i) begin_[i] = n * i / std::max(m_, 1);
  results_.assign(m_, Result());
  for (auto& st : stages_) {
    st->out.assign(m_, Tensor());
    st->dx.assign(m_, Tensor());
    st->dlogits.assign(m_, Tensor());
    st->labels.assign(m_, Tensor());
    st->out_ready.resize(m_);
    st->dx_ready.resize(m_);
  }
  return m_;
}

// `t` (the neighbouring stage's, written in its lane) in stage `to`'s lane:
// a copy made on its stream once the writer's event has passed there.
Tensor PipelineModel::Receive(Stage& to, const Tensor& t) const {
  return to.gpu() ? t.To(to.device) : t;
}

void PipelineModel::Forward(int s, int i) {
  Stage& st = *stages_[s];
  const GpuLaneScope lane(st.lane);
  const auto begin = std::chrono::steady_clock::now();
  st.arena->execute([&] {
    Model& model = *st.slots[i % st.slots.size()];
    if (s > 0 && st.gpu()) stages_[s - 1]->out_ready[i]->Await(st.device);
    if (st.meter) st.meter->StartOfWork();  // the wait above counts as idle
    // Stage s - 1 lets go of out[i] after its backward of i, which waits for
    // this stage's backward of i: the copy has run by then.
    Tensor in = s == 0 ? x_.Slice(begin_[i], begin_[i + 1]) : Receive(st, stages_[s - 1]->out[i]);
    if (in.device() != st.device) in = in.To(st.device);  // the batch's rows, from the host
    ForwardContext ctx = ctx_;
    if (ctx.sample_ids) ctx.sample_ids += begin_[i];
    st.out[i] = model.Forward(in, ctx);
    if (s + 1 == num_stages()) {
      Tensor& d = st.dlogits[i];
      d = Tensor::Empty(st.out[i].shape(), st.out[i].dtype(), st.device);
      const int64_t rows = begin_[i + 1] - begin_[i];
      const int64_t* labels = labels_ + begin_[i];
      if (st.gpu()) {
        st.labels[i] = LabelTensor(labels, rows, st.device);
        labels = st.labels[i].data<int64_t>();
      }
      std::shared_ptr<PendingLoss> loss =
          SoftmaxCrossEntropyAsync(st.out[i], labels, &d, grad_scale_, label_smoothing_);
      if (loss->ready()) {  // the host's: checked at once
        const LossResult r = loss->Get();
        if (!std::isfinite(r.loss)) {
          throw Error(StrCat("loss is ", r.loss, " at step ", ctx_.step, " (micro-batch ", i,
                             "): lower the learning rate or check the data"));
        }
        results_[i] = {r.loss * static_cast<double>(rows), r.correct, nullptr};
      } else {  // a GPU's: read by the lanes' gather, off this thread
        results_[i].pending = std::move(loss);
      }
    } else if (st.gpu()) {
      st.out_ready[i] = std::make_unique<StreamEvent>(st.device);
    }
    if (st.meter) st.meter->EndOfWork();
  });
  st.max_held = std::max(st.max_held, ++st.held);
  st.busy += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

void PipelineModel::Backward(int s, int i) {
  Stage& st = *stages_[s];
  const GpuLaneScope lane(st.lane);
  const auto begin = std::chrono::steady_clock::now();
  st.arena->execute([&] {
    Model& model = *st.slots[i % st.slots.size()];
    const bool last = s + 1 == num_stages();
    if (!last && st.gpu()) stages_[s + 1]->dx_ready[i]->Await(st.device);
    if (st.meter) {
      st.meter->StartOfWork();
      st.meter->Mark(kGpuBackward);
    }
    Tensor dy = last ? st.dlogits[i] : Receive(st, stages_[s + 1]->dx[i]);
    if (!last && st.gpu()) {  // stage s + 1's block, kept until the copy has run
      st.retired.emplace_back(stages_[s + 1]->dx[i], std::make_unique<StreamEvent>(st.device));
    }
    model.Backward(dy, {}, s > 0 ? &st.dx[i] : nullptr);
    if (s > 0 && st.gpu()) st.dx_ready[i] = std::make_unique<StreamEvent>(st.device);
    if (st.meter) st.meter->EndOfWork();
    st.out[i] = Tensor();
    st.dlogits[i] = Tensor();
    st.labels[i] = Tensor();
    if (!last) stages_[s + 1]->dx[i] = Tensor();
    st.DropCopied();
  });
  --st.held;
  st.busy += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

void PipelineModel::StartGradientSum(int s, MpiWorld& world) {
  Stage& st = *stages_[s];
  const GpuLaneScope lane(st.lane);
  const auto params = stage_model(s).NamedParameters();
  int64_t total = 0;
  for (const auto& p : params) total += p.param->grad.numel();
  if (st.flat_grads.numel() != total) st.flat_grads = Tensor::Empty(Shape({total}), DType::kF32);
  // Through host memory on GPUs (a copy to the host waits for the stream).
  auto* f = static_cast<char*>(st.flat_grads.raw_data());
  for (const auto& p : params) {
    const Tensor& g = p.param->grad;
    CopyBytes(Device::Cpu(), f, g.device(), g.raw_data(), g.nbytes());
    f += g.nbytes();
  }
  st.gradient_sum = world.StartAllReduceSum(st.flat_grads.data<float>(), total,
                                            StrCat("pipeline stage ", s, " gradients"));
}

void PipelineModel::FinishGradientSum(int s, MpiWorld& world, double timeout_s) {
  Stage& st = *stages_[s];
  const GpuLaneScope lane(st.lane);
  world.Wait(st.gradient_sum, timeout_s);
  const auto* f = static_cast<const char*>(st.flat_grads.raw_data());
  for (const auto& p : stage_model(s).NamedParameters()) {
    Tensor& g = p.param->grad;
    CopyBytes(g.device(), g.raw_data(), Device::Cpu(), f, g.nbytes());
    f += g.nbytes();
  }
}

void PipelineModel::Step(int s, double lr) {
  Stage& st = *stages_[s];
  const GpuLaneScope lane(st.lane);
  if (st.meter) {
    st.meter->StartOfWork();
    st.meter->Mark(kGpuOptimizer);
  }
  st.arena->execute([&] {
    st.optimizer->Step(lr);
    stage_model(s).ZeroGrad();  // the stage's share of the full model's gradients
  });
  if (st.meter) st.meter->EndOfWork();
  if (s == 0) x_ = Tensor();  // only stage 0 reads the batch
  if (++stepped_ == num_stages()) {
    stepped_ = 0;
    step_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - step_begin_).count();
  }
}

PipelineModel::Result PipelineModel::StepResult() const {
  Result total;
  std::shared_ptr<MicroBatchLosses> losses;  // GPUs
  for (int i = 0; i < static_cast<int>(results_.size()); ++i) {
    const Result& r = results_[i];
    if (r.pending) {
      if (!losses) losses = std::make_shared<MicroBatchLosses>();
      losses->Add(r.pending, begin_[i + 1] - begin_[i]);
    }
    total.loss_sum += r.loss_sum;
    total.correct += r.correct;
  }
  total.pending = std::move(losses);
  return total;
}

Tensor PipelineModel::Infer(const Tensor& x, const ForwardContext& ctx) {
  Tensor h = x;
  for (auto& st : stages_) {
    if (h.device() != st->device) h = h.To(st->device);
    h = st->slots[0]->Forward(h, ctx);
  }
  return h;
}

void PipelineModel::Synchronize() {
  for (auto& st : stages_) {
    if (!st->gpu()) continue;
    for (int lane : {0, st->lane}) {  // lane 0: the host's own work between passes
      const GpuLaneScope scope(lane);
      SynchronizeDevice(st->device);
    }
    st->retired.clear();
  }
}

std::vector<double> PipelineModel::busy_seconds() const {
  std::vector<double> v;
  for (const auto& st : stages_) {
    if (!st->meter) {
      v.push_back(st->busy);
      continue;
    }
    double busy = 0;
    for (int p = 0; p < kGpuPhases; ++p) busy += st->meter->busy_seconds(static_cast<GpuPhase>(p));
    v.push_back(busy);
  }
  return v;
}

std::vector<int> PipelineModel::max_held() const {
  std::vector<int> v;
  for (const auto& st : stages_) v.push_back(st->max_held);
  return v;
}

std::vector<double> PipelineModel::bubble() const {
  const std::vector<double> busy = busy_seconds();
  std::vector<double> v;
  for (size_t s = 0; s < stages_.size(); ++s) {
    if (stages_[s]->meter) {
      const double idle = stages_[s]->meter->idle_seconds();
      v.push_back(busy[s] + idle > 0 ? idle / (busy[s] + idle) : 0);
    } else {
      v.push_back(step_seconds_ > 0 ? 1 - busy[s] / step_seconds_ : 0);
    }
  }
  return v;
}

double PipelineModel::theoretical_bubble() const {
  const double s = num_stages(), m = options_.microbatches;
  return (s - 1) / (m + s - 1);
}

void PipelineModel::ResetStats() {
  step_seconds_ = 0;
  for (auto& st : stages_) {
    st->busy = 0;
    st->max_held = 0;
    if (st->meter) st->meter->Reset();
  }
}

}  // namespace cnnflow
