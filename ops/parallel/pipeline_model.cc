#include "ops/parallel/pipeline_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>

#include "ops/collectives/collective_mpi.h"
#include "ops/cpu/parallel.h"
#include "ops/loss.h"

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

struct PipelineModel::Stage {
  std::vector<std::unique_ptr<Model>> slots;  // one per micro-batch held at once
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<tbb::task_arena> arena;
  std::vector<Tensor> out;      // per micro-batch: this stage's output
  std::vector<Tensor> dx;       // per micro-batch: gradient of this stage's input
  std::vector<Tensor> dlogits;  // last stage: the loss gradient
  Tensor flat_grads;            // the gradients being summed over processes
  MpiRequest gradient_sum;
  double busy = 0;
  int held = 0, max_held = 0;
};

PipelineModel::PipelineModel(const std::vector<LayerSpec>& layers, const Shape& input_shape,
                             uint64_t seed, InitScheme init, const OptimizerSpec& optimizer,
                             PipelineOptions options)
    : options_(std::move(options)) {
  full_ = Model::Build(layers, input_shape, {.seed = seed, .init = init});
  full_->ZeroGrad();
  const int num_stages = static_cast<int>(options_.stages.size());
  CNNFLOW_ENFORCE(options_.microbatches >= 1, "microbatches must be >= 1, got ",
                  options_.microbatches);
  if (num_stages < 1) throw ConfigError("a pipeline needs at least one stage");
  // The cut: contiguous, complete, in order.
  std::map<std::string, int> index, stage_of;
  for (int i = 0; i < full_->num_layers(); ++i) index[full_->layer(i).name()] = i;
  int next = 0;
  for (int s = 0; s < num_stages; ++s) {
    if (options_.stages[s].empty())
      throw ConfigError(StrCat("pipeline stage ", s, " has no layers"));
    for (const std::string& name : options_.stages[s]) {
      auto it = index.find(name);
      if (it == index.end())
        throw ConfigError(StrCat("pipeline stage ", s, ": no layer '", name, "'"));
      if (it->second != next) {
        throw ConfigError(StrCat("pipeline stage ", s, ": layer '", name,
                                 "' is out of order; stages "
                                 "must list the model's layers in order, each once (expected '",
                                 next < full_->num_layers() ? full_->layer(next).name() : "nothing",
                                 "')"));
      }
      stage_of[name] = s;
      ++next;
    }
  }
  if (next != full_->num_layers()) {
    throw ConfigError(StrCat("pipeline stages leave out layer '", full_->layer(next).name(),
                             "' and after; every layer must be in a stage"));
  }
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
        if (stage_of.count(in) == 0 || stage_of[in] != s) {
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
    const int slots =
        options_.schedule == PipelineSchedule::kGpipe ? m : std::min(m, num_stages - s);
    for (int k = 0; k < slots; ++k) {
      auto model = Model::Build(specs, in_shape, {.seed = seed, .init = init});
      // Share the full model's storage: parameters, gradients, buffers.
      for (int l = 0; l < model->num_layers(); ++l) {
        Layer& mine = model->layer(l);
        Layer& theirs = full_->layer(first + l);
        for (size_t p = 0; p < mine.parameters().size(); ++p) {
          mine.parameters()[p].value = theirs.parameters()[p].value;
          mine.parameters()[p].grad = theirs.parameters()[p].grad;
        }
        for (size_t b = 0; b < mine.buffers().size(); ++b)
          mine.buffers()[b].value = theirs.buffers()[b].value;
      }
      stage->slots.push_back(std::move(model));
    }
    stage->optimizer = MakeOptimizer(optimizer, stage->slots[0]->NamedParameters());
    stage->arena = cpu::MakeComputeArena(options_.threads_per_stage, options_.flush_denormals);
    stages_.push_back(std::move(stage));
    first += count;
  }
}

PipelineModel::~PipelineModel() = default;

Optimizer& PipelineModel::optimizer(int s) { return *stages_[s]->optimizer; }
Model& PipelineModel::stage_model(int s) { return *stages_[s]->slots[0]; }

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
  }
  return m_;
}

void PipelineModel::Forward(int s, int i) {
  Stage& st = *stages_[s];
  const auto begin = std::chrono::steady_clock::now();
  st.arena->execute([&] {
    Model& model = *st.slots[i % st.slots.size()];
    const Tensor in = s == 0 ? x_.Slice(begin_[i], begin_[i + 1]) : stages_[s - 1]->out[i];
    ForwardContext ctx = ctx_;
    if (ctx.sample_ids) ctx.sample_ids += begin_[i];
    st.out[i] = model.Forward(in, ctx);
    if (s + 1 == num_stages()) {
      Tensor& d = st.dlogits[i];
      d = Tensor::Empty(st.out[i].shape(), st.out[i].dtype());
      const LossResult r =
          SoftmaxCrossEntropy(st.out[i], labels_ + begin_[i], &d, grad_scale_, label_smoothing_);
      if (!std::isfinite(r.loss)) {
        throw Error(StrCat("loss is ", r.loss, " at step ", ctx_.step, " (micro-batch ", i,
                           "): lower the learning rate or check the data"));
      }
      results_[i] = {r.loss * static_cast<double>(begin_[i + 1] - begin_[i]), r.correct};
    }
  });
  st.max_held = std::max(st.max_held, ++st.held);
  st.busy += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

void PipelineModel::Backward(int s, int i) {
  Stage& st = *stages_[s];
  const auto begin = std::chrono::steady_clock::now();
  st.arena->execute([&] {
    Model& model = *st.slots[i % st.slots.size()];
    const Tensor& dy = s + 1 == num_stages() ? st.dlogits[i] : stages_[s + 1]->dx[i];
    model.Backward(dy, {}, s > 0 ? &st.dx[i] : nullptr);
    st.out[i] = Tensor();
    if (s + 1 < num_stages()) stages_[s + 1]->dx[i] = Tensor();
  });
  --st.held;
  st.busy += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

void PipelineModel::StartGradientSum(int s, MpiWorld& world) {
  Stage& st = *stages_[s];
  const auto params = stage_model(s).NamedParameters();
  int64_t total = 0;
  for (const auto& p : params) total += p.param->grad.numel();
  if (st.flat_grads.numel() != total) st.flat_grads = Tensor::Empty(Shape({total}), DType::kF32);
  float* f = st.flat_grads.data<float>();
  for (const auto& p : params)
    f = std::copy_n(p.param->grad.data<float>(), p.param->grad.numel(), f);
  st.gradient_sum = world.StartAllReduceSum(st.flat_grads.data<float>(), total,
                                            StrCat("pipeline stage ", s, " gradients"));
}

void PipelineModel::FinishGradientSum(int s, MpiWorld& world, double timeout_s) {
  Stage& st = *stages_[s];
  world.Wait(st.gradient_sum, timeout_s);
  const float* f = st.flat_grads.data<float>();
  for (const auto& p : stage_model(s).NamedParameters()) {
    std::copy_n(f, p.param->grad.numel(), p.param->grad.data<float>());
    f += p.param->grad.numel();
  }
}

void PipelineModel::Step(int s, double lr) {
  Stage& st = *stages_[s];
  st.arena->execute([&] {
    st.optimizer->Step(lr);
    stage_model(s).ZeroGrad();  // the stage's share of the full model's gradients
  });
  if (s == 0) x_ = Tensor();  // only stage 0 reads the batch
  if (++stepped_ == num_stages()) {
    stepped_ = 0;
    step_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - step_begin_).count();
  }
}

PipelineModel::Result PipelineModel::StepResult() const {
  Result total;
  for (const Result& r : results_) {
    total.loss_sum += r.loss_sum;
    total.correct += r.correct;
  }
  return total;
}

std::vector<double> PipelineModel::busy_seconds() const {
  std::vector<double> v;
  for (const auto& st : stages_) v.push_back(st->busy);
  return v;
}

std::vector<int> PipelineModel::max_held() const {
  std::vector<int> v;
  for (const auto& st : stages_) v.push_back(st->max_held);
  return v;
}

std::vector<double> PipelineModel::bubble() const {
  std::vector<double> v;
  for (const auto& st : stages_) v.push_back(step_seconds_ > 0 ? 1 - st->busy / step_seconds_ : 0);
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
  }
}

}  // namespace cnnflow
