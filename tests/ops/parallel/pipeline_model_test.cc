// Pipeline model parallelism (ops/parallel/pipeline_model.h), invariant 2 of
// DESIGN.md: S stages x M micro-batches == the unsplit model on the batch,
// for both schedules; with BatchNorm, == the unsplit model accumulating over
// the same micro-batches (per-micro-batch statistics). 1F1B holds at most
// S - s micro-batches in stage s. Cut errors are clear.
#include "ops/parallel/pipeline_model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "ops/loss.h"
#include "ops/random.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

using testing::Spec;

std::vector<LayerSpec> Net(bool bn) {
  std::vector<LayerSpec> v = {
      Spec("conv1", "conv2d", {{"out", int64_t{4}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}})};
  if (bn) v.push_back(Spec("bn1", "batchnorm"));
  for (auto& l : std::vector<LayerSpec>{
           Spec("relu1", "relu"), Spec("pool1", "maxpool2d", {{"kernel", int64_t{2}}}),
           Spec("conv2", "conv2d",
                {{"out", int64_t{6}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
           Spec("relu2", "relu"), Spec("flatten", "flatten"),
           Spec("fc1", "linear", {{"out", int64_t{12}}}), Spec("relu3", "relu"),
           Spec("fc2", "linear", {{"out", int64_t{5}}})})
    v.push_back(l);
  return v;
}
const Shape kInput{2, 8, 8};

// conv, then two residual blocks (conv, relu, conv, add with the block's
// input, relu), then the head: the only cuts with one tensor crossing are
// before each block, before its last relu, and before the head's layers.
std::vector<LayerSpec> ResidualNet() {
  auto conv = [](const std::string& name) {
    return Spec(name, "conv2d", {{"out", int64_t{4}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}});
  };
  std::vector<LayerSpec> v = {conv("stem")};
  std::string in = "stem";
  for (const char* b : {"b1", "b2"}) {
    const std::string n = b;
    v.push_back(conv(n + "_conv1"));
    v.push_back(Spec(n + "_relu1", "relu"));
    v.push_back(conv(n + "_conv2"));
    v.push_back(Spec(n + "_add", "add"));
    v.back().inputs = {n + "_conv2", in};
    v.push_back(Spec(n + "_relu2", "relu"));
    in = n + "_relu2";
  }
  for (auto& l : {Spec("flatten", "flatten"), Spec("fc", "linear", {{"out", int64_t{5}}})})
    v.push_back(l);
  return v;
}

std::vector<std::vector<std::string>> Cut(const std::vector<LayerSpec>& net,
                                          std::vector<int> sizes) {
  std::vector<std::vector<std::string>> out;
  size_t k = 0;
  for (int n : sizes) {
    out.emplace_back();
    for (int i = 0; i < n; ++i) out.back().push_back(net[k++].name);
  }
  return out;
}

Args Sgd() {
  Args a;
  a.Set("lr", 0.1);
  a.Set("momentum", 0.9);
  a.FillDefaults(OptimizerSchema("sgd"));
  return a;
}

struct Batch {
  Tensor x;
  std::vector<int64_t> labels, ids;
};
Batch MakeBatch(int64_t n, uint64_t seed) {
  Batch b;
  b.x = Tensor::Empty(kInput.WithBatch(n), DType::kF32);
  Rng rng(seed);
  for (int64_t i = 0; i < b.x.numel(); ++i)
    b.x.data<float>()[i] = static_cast<float>(rng.Uniform(-1, 1));
  for (int64_t i = 0; i < n; ++i) {
    b.labels.push_back(static_cast<int64_t>(rng.NextU64() % 5));
    b.ids.push_back(i);
  }
  return b;
}

// Runs every action of one step, each as soon as its inputs are ready
// (stages taken in turn): a sequential driver with the schedule's order.
void PipelineStep(PipelineModel& p, const Batch& b, int64_t step) {
  ForwardContext ctx{true, 1, step, b.ids.data()};
  const int m = p.BeginStep(b.x, b.labels.data(), ctx, 1.0 / b.x.dim(0), 0);
  const int s_count = p.num_stages();
  std::vector<std::vector<PipelineAction>> plan;
  for (int s = 0; s < s_count; ++s)
    plan.push_back(StageSchedule(p.options().schedule, s, s_count, m));
  std::vector<size_t> next(s_count, 0);
  std::vector<std::vector<bool>> fdone(s_count, std::vector<bool>(m)), bdone = fdone;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < s_count; ++s) {
      if (next[s] == plan[s].size()) continue;
      const PipelineAction a = plan[s][next[s]];
      const bool ready = a.forward ? (s == 0 || fdone[s - 1][a.microbatch])
                                   : (s + 1 == s_count || bdone[s + 1][a.microbatch]);
      if (!ready) continue;
      if (a.forward) {
        p.Forward(s, a.microbatch);
        fdone[s][a.microbatch] = true;
      } else {
        p.Backward(s, a.microbatch);
        bdone[s][a.microbatch] = true;
      }
      ++next[s];
      progress = true;
    }
  }
  for (int s = 0; s < s_count; ++s) ASSERT_EQ(next[s], plan[s].size()) << "stage " << s << " stuck";
  for (int s = 0; s < s_count; ++s) p.Step(s, 0.1);
}

// The unsplit model: gradients of `parts` micro-batches added, one step.
void ReferenceStep(Model& model, Optimizer& opt, const Batch& b, int parts, int64_t step) {
  model.ZeroGrad();
  const int64_t n = b.x.dim(0);
  for (int i = 0; i < parts; ++i) {
    const int64_t lo = n * i / parts, hi = n * (i + 1) / parts;
    ForwardContext ctx{true, 1, step, b.ids.data() + lo};
    const Tensor& y = model.Forward(b.x.Slice(lo, hi), ctx);
    Tensor dy = Tensor::Empty(y.shape(), y.dtype());
    SoftmaxCrossEntropy(y, b.labels.data() + lo, &dy, 1.0 / n);
    model.Backward(dy);
  }
  opt.Step(0.1);
}

// Of two models on any devices (their parameters copied to the host).
double MaxRelDiff(Model& a, Model& b) {
  double worst = 0;
  auto pa = a.NamedParameters(), pb = b.NamedParameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    const Tensor ta = pa[i].param->value.To(Device::Cpu());
    const Tensor tb = pb[i].param->value.To(Device::Cpu());
    const float* x = ta.data<float>();
    const float* y = tb.data<float>();
    double scale = 1e-12;
    for (int64_t j = 0; j < ta.numel(); ++j) scale = std::max(scale, std::fabs(double(x[j])));
    for (int64_t j = 0; j < ta.numel(); ++j)
      worst = std::max(worst, std::fabs(double(x[j]) - y[j]) / scale);
  }
  return worst;
}

// With BN, the unsplit model accumulates over the micro-batches.
void ExpectPipelineMatches(const std::vector<LayerSpec>& net, bool bn, std::vector<int> sizes,
                           int m, PipelineSchedule schedule, int64_t batch) {
  PipelineOptions o;
  o.stages = Cut(net, sizes);
  o.microbatches = m;
  o.schedule = schedule;
  PipelineModel p(net, kInput, 3, InitScheme::kPytorchDefault, {"sgd", Sgd()}, o);
  auto ref = Model::Build(net, kInput, {.seed = 3});
  auto opt = MakeOptimizer("sgd", Sgd(), ref->NamedParameters());
  ASSERT_LT(MaxRelDiff(p.full(), *ref), 1e-30) << "the same initial parameters";
  for (int step = 0; step < 3; ++step) {
    const Batch b = MakeBatch(batch, 50 + step);
    PipelineStep(p, b, step);
    // Without BN the split does not matter: one pass over the whole batch.
    ReferenceStep(*ref, *opt, b, bn ? static_cast<int>(std::min<int64_t>(m, batch)) : 1, step);
  }
  EXPECT_LT(MaxRelDiff(p.full(), *ref), 2e-5);
  auto fresh = Model::Build(net, kInput, {.seed = 3});
  EXPECT_GT(MaxRelDiff(p.full(), *fresh), 1e-3) << "training moved the weights";
  const std::vector<int> held = p.max_held();
  const int s_count = static_cast<int>(sizes.size());
  for (int s = 0; s < s_count; ++s) {
    if (schedule == PipelineSchedule::kOneFOneB) {
      EXPECT_LE(held[s], s_count - s) << "stage " << s;
      EXPECT_LE(held[s], s_count);
    } else {
      EXPECT_EQ(held[s], std::min<int64_t>(m, batch)) << "stage " << s;
    }
  }
}

TEST(PipelineModel, TwoAndThreeStagesMatchTheUnsplitModel) {
  const int layers = static_cast<int>(Net(false).size());  // 10
  for (auto schedule : {PipelineSchedule::kGpipe, PipelineSchedule::kOneFOneB}) {
    for (int m : {1, 4, 5}) {
      SCOPED_TRACE(StrCat(schedule == PipelineSchedule::kGpipe ? "gpipe" : "1f1b", " m=", m));
      ExpectPipelineMatches(Net(false), false, {4, layers - 4}, m, schedule, 12);
      ExpectPipelineMatches(Net(false), false, {2, 5, layers - 7}, m, schedule, 13);
    }
  }
}

TEST(PipelineModel, WithBatchNormMatchesAccumulationOverTheMicroBatches) {
  const int layers = static_cast<int>(Net(true).size());
  for (auto schedule : {PipelineSchedule::kGpipe, PipelineSchedule::kOneFOneB}) {
    ExpectPipelineMatches(Net(true), true, {3, layers - 3}, 4, schedule, 16);
    ExpectPipelineMatches(Net(true), true, {1, 4, layers - 5}, 3, schedule, 12);
  }
}

// Cut between residual blocks, the block input crosses to the conv and the
// add of the next stage: its gradient there is the sum of both.
TEST(PipelineModel, CutsBetweenResidualBlocksMatchTheUnsplitModel) {
  const std::vector<LayerSpec> net = ResidualNet();  // stem | b1 (5) | b2 (5) | flatten, fc
  for (auto schedule : {PipelineSchedule::kGpipe, PipelineSchedule::kOneFOneB}) {
    ExpectPipelineMatches(net, false, {1, 10, 2}, 3, schedule, 12);
    ExpectPipelineMatches(net, false, {6, 7}, 4, schedule, 12);
  }
}

// On one GPU, a lane per stage (ops/device.h): after 3 steps the weights,
// the losses and the evaluation forward equal the CPU pipeline's (f32, full
// f32 convolutions, deterministic cuDNN), for both schedules, with BN and
// across residual cuts; each stage's GPU time is counted. In bf16 the loss
// stays within 5% of f32's.
TEST(PipelineModelGPU, StagesInLanesOfOneGpuMatchTheCpuPipeline) {
  if (!CudaAvailable()) GTEST_SKIP() << "no GPU found: GPU test skipped";
  struct Case {
    std::vector<LayerSpec> net;
    std::vector<int> sizes;
  };
  const std::vector<Case> cases = {{Net(true), {5, 5}}, {ResidualNet(), {6, 7}}};
  for (auto schedule : {PipelineSchedule::kGpipe, PipelineSchedule::kOneFOneB}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(StrCat(PipelineScheduleName(schedule), " ", c.net.size(), " layers"));
      PipelineOptions o;
      o.stages = Cut(c.net, c.sizes);
      o.microbatches = 4;
      o.schedule = schedule;
      PipelineModel cpu(c.net, kInput, 3, InitScheme::kPytorchDefault, {"sgd", Sgd()}, o);
      o.devices = {Device::Cuda(0), Device::Cuda(0)};
      o.gpu_math = {.tf32 = false, .deterministic = true};
      PipelineModel gpu(c.net, kInput, 3, InitScheme::kPytorchDefault, {"sgd", Sgd()}, o);
      o.compute = DType::kBF16;
      PipelineModel bf16(c.net, kInput, 3, InitScheme::kPytorchDefault, {"sgd", Sgd()}, o);
      ASSERT_EQ(gpu.lane(0), 0);
      ASSERT_EQ(gpu.lane(1), 1);
      ASSERT_TRUE(gpu.full().device().is_cuda());
      for (int step = 0; step < 3; ++step) {
        const Batch b = MakeBatch(12, 50 + step);
        PipelineStep(cpu, b, step);
        PipelineStep(gpu, b, step);
        PipelineStep(bf16, b, step);
        const PipelineModel::Result rc = cpu.StepResult(), rg = gpu.StepResult(),
                                    rb = bf16.StepResult();
        ASSERT_NE(rg.pending, nullptr) << "a GPU loss comes back asynchronously";
        const LossResult lg = rg.pending->Get();
        EXPECT_NEAR(lg.loss, rc.loss_sum / 12, 1e-5) << "step " << step;
        EXPECT_EQ(lg.correct, rc.correct) << "step " << step;
        EXPECT_NEAR(rb.pending->Get().loss, lg.loss, 0.05 * lg.loss) << "bf16, step " << step;
      }
      gpu.Synchronize();
      EXPECT_LT(MaxRelDiff(cpu.full(), gpu.full()), 1e-5);
      for (double busy : gpu.busy_seconds()) EXPECT_GT(busy, 0);
      const Batch b = MakeBatch(12, 99);
      ForwardContext eval{false, 1, 0, b.ids.data()};
      const Tensor want = cpu.Infer(b.x, eval);
      const Tensor got = gpu.Infer(b.x, eval).To(Device::Cpu());
      ASSERT_EQ(got.shape(), want.shape());
      for (int64_t j = 0; j < want.numel(); ++j) EXPECT_NEAR(got.At(j), want.At(j), 1e-4) << j;
    }
  }
}

TEST(PipelineModel, OneFOneBScheduleShape) {
  // Stage 0 of 3 with 5 micro-batches: F0 F1, then F2 B0 F3 B1 F4 B2, then B3 B4.
  std::string got;
  for (const auto& a : StageSchedule(PipelineSchedule::kOneFOneB, 0, 3, 5))
    got += StrCat(a.forward ? "F" : "B", a.microbatch, " ");
  EXPECT_EQ(got, "F0 F1 F2 B0 F3 B1 F4 B2 B3 B4 ");
  got.clear();
  for (const auto& a : StageSchedule(PipelineSchedule::kOneFOneB, 2, 3, 5))
    got += StrCat(a.forward ? "F" : "B", a.microbatch, " ");
  EXPECT_EQ(got, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 ");
}

TEST(PipelineModel, BadCutsAreClearErrors) {
  const auto net = Net(false);
  auto expect = [&](std::vector<std::vector<std::string>> stages, const std::string& what) {
    PipelineOptions o;
    o.stages = std::move(stages);
    try {
      PipelineModel p(net, kInput, 3, InitScheme::kPytorchDefault, {"sgd", Sgd()}, o);
      FAIL() << "expected: " << what;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect({{"conv1", "pool1"}, {"relu1"}}, "layer 'pool1' is out of order");
  expect({{"conv1", "relu1", "pool1"}}, "pipeline stages leave out layer 'conv2'");
  expect({{"conv1", "relu1", "nope"}}, "no layer 'nope'");
  auto res = Net(false);
  // relu2 reads relu1, inside stage 0, from stage 1 (only stage 0's last
  // output, pool1, crosses the cut).
  res[5].inputs = {"relu1"};
  PipelineOptions o;
  o.stages = {{"conv1", "relu1", "pool1"}, {"conv2", "relu2", "flatten", "fc1", "relu3", "fc2"}};
  try {
    PipelineModel p(res, kInput, 3, InitScheme::kPytorchDefault, {"sgd", Sgd()}, o);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("reads 'relu1' from another stage"), std::string::npos)
        << e.what();
  }
}

TEST(PipelineModel, BalancedCutMinimisesTheLargestStage) {
  auto model = Model::Build(Net(false), kInput, {.seed = 3});
  for (int s = 1; s <= 4; ++s) {
    const auto cut = BalancedCut(*model, s);
    ASSERT_EQ(static_cast<int>(cut.size()), s);
    // Cost of the largest stage, and the brute-force best over every cut.
    std::vector<double> flops;
    for (int i = 0; i < model->num_layers(); ++i)
      flops.push_back(double(model->layer(i).ForwardFlops(1)));
    auto worst = [&](const std::vector<int>& bounds) {
      double w = 0;
      for (size_t k = 0; k + 1 < bounds.size(); ++k) {
        double c = 0;
        for (int i = bounds[k]; i < bounds[k + 1]; ++i) c += flops[i];
        w = std::max(w, c);
      }
      return w;
    };
    std::vector<int> bounds = {0};
    int k = 0;
    for (const auto& st : cut) bounds.push_back(k += static_cast<int>(st.size()));
    ASSERT_EQ(bounds.back(), model->num_layers());
    double best = 1e300;
    const int n = model->num_layers();
    std::function<void(std::vector<int>&, int)> search = [&](std::vector<int>& b, int left) {
      if (left == 1) {
        b.push_back(n);
        best = std::min(best, worst(b));
        b.pop_back();
        return;
      }
      for (int i = b.back() + 1; i <= n - left + 1; ++i) {
        b.push_back(i);
        search(b, left - 1);
        b.pop_back();
      }
    };
    std::vector<int> start = {0};
    search(start, s);
    EXPECT_DOUBLE_EQ(worst(bounds), best) << s << " stages";
  }
}

// stages: auto on a residual net cuts only between blocks (a cut inside
// one is refused by the pipeline), still as evenly as those allow.
TEST(PipelineModel, BalancedCutCutsOnlyBetweenResidualBlocks) {
  const std::vector<LayerSpec> net = ResidualNet();
  auto model = Model::Build(net, kInput, {.seed = 3});
  const std::vector<bool> points = CutPoints(*model);
  std::vector<std::string> at;
  for (int p = 1; p < model->num_layers(); ++p)
    if (points[p]) at.push_back(model->layer(p).name());
  EXPECT_EQ(at, (std::vector<std::string>{"b1_conv1", "b1_relu2", "b2_conv1", "b2_relu2", "flatten",
                                          "fc"}));
  for (int s = 2; s <= 7; ++s) {
    PipelineOptions o;
    o.stages = BalancedCut(*model, s);
    ASSERT_EQ(static_cast<int>(o.stages.size()), s);
    for (size_t k = 1; k < o.stages.size(); ++k) {
      EXPECT_NE(std::find(at.begin(), at.end(), o.stages[k][0]), at.end())
          << s << " stages: stage " << k << " starts at " << o.stages[k][0];
    }
    EXPECT_NO_THROW(PipelineModel(net, kInput, 3, InitScheme::kPytorchDefault, {"sgd", Sgd()}, o));
  }
  testing::ExpectContains(testing::ErrorOf<ConfigError>([&] { BalancedCut(*model, 8); }),
                          {"6 place(s) where one tensor crosses", "at most 7 stages"});
}

}  // namespace
}  // namespace cnnflow
