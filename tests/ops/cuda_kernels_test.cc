// The own CUDA kernels against the CPU: the relu, add, flatten, dropout and
// linear layers (through gpu_check.h's CompareWithCpu, in f32 and in
// f16/bf16 mixed precision), softmax cross-entropy, the fused SGD / Adam /
// AdamW steps, Axpy / Scale, Cast / AddCast and the loss scaler's
// UnscaleAndFindNonFinite. GPU tests skip without a GPU; the host
// references of f16/bf16 rounding are tested here on the CPU too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfenv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ops/batch_stager.h"
#include "ops/cuda/kernels.h"
#include "ops/dropout.h"
#include "ops/loss.h"
#include "ops/optimizer.h"
#include "tests/ops/gpu_check.h"
#include "tests/ops/gradient_check.h"

#if CNNFLOW_WITH_CUDA
#include "ops/cuda/cublas_api.h"
#endif

namespace cnnflow {
namespace {

using testing::CompareWithCpu;
using testing::NormalisedError;
using testing::RandomTensor;
using testing::Spec;

const Device kGpu = Device::Cuda(0);

// Prints every figure, so a failure says which part is off.
std::string Describe(const testing::GpuCpuComparison& c) {
  return StrCat("output ", c.output, ", input grad ", c.input_grad, ", param grad ", c.param_grad,
                " (worst: '", c.worst_param, "'), buffers ", c.buffer);
}

// int64 labels copied into GPU memory (the GPU loss reads them there).
struct DeviceLabels {
  explicit DeviceLabels(const std::vector<int64_t>& host)
      : labels(LabelTensor(host.data(), static_cast<int64_t>(host.size()), kGpu)) {}
  const int64_t* get() const { return labels.data<int64_t>(); }
  Tensor labels;
};

// ---------------------------------------------------------------- layers

TEST(ReluGPU, MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const auto c = CompareWithCpu({Spec("relu1", "relu")}, Shape{3, 5, 7}, 6);
  EXPECT_LE(c.output, 1e-6) << Describe(c);
  EXPECT_LE(c.input_grad, 1e-6) << Describe(c);
}

TEST(ReluGPU, OddSizeTakesTheScalarTail) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // 3 * 7 = 21 elements per sample: not a multiple of 4.
  const auto c = CompareWithCpu({Spec("relu1", "relu")}, Shape{3, 7}, 5);
  EXPECT_LE(c.output, 1e-6) << Describe(c);
  EXPECT_LE(c.input_grad, 1e-6) << Describe(c);
}

TEST(AddGPU, ResidualModelMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // fc1's output feeds relu1 and the add: its gradient is the sum of two
  // (Model::Backward's fan-out, through cuda::Axpy).
  const auto c = CompareWithCpu(
      {Spec("fc1", "linear", {{"out", int64_t{9}}}), Spec("relu1", "relu"),
       Spec("fc2", "linear", {{"out", int64_t{9}}}), Spec("sum", "add", {}, {"fc2", "fc1"}),
       Spec("fc3", "linear", {{"out", int64_t{4}}})},
      Shape{11}, 6);
  EXPECT_LE(c.output, 1e-4) << Describe(c);
  EXPECT_LE(c.input_grad, 1e-4) << Describe(c);
  EXPECT_LE(c.param_grad, 1e-4) << Describe(c);
}

TEST(AddGPU, BothInputsFromTheModelInput) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // dx = dy + dy: both gradients of the add land on the input.
  const auto c = CompareWithCpu({Spec("twice", "add", {}, {"input", "input"})}, Shape{2, 9}, 3);
  EXPECT_LE(c.output, 1e-6) << Describe(c);
  EXPECT_LE(c.input_grad, 1e-6) << Describe(c);
}

TEST(FlattenGPU, MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const auto c = CompareWithCpu(
      {Spec("flat", "flatten"), Spec("fc", "linear", {{"out", int64_t{5}}})}, Shape{2, 3, 4}, 5);
  EXPECT_LE(c.output, 1e-4) << Describe(c);
  EXPECT_LE(c.input_grad, 1e-4) << Describe(c);
  EXPECT_LE(c.param_grad, 1e-4) << Describe(c);
  const auto alone = CompareWithCpu({Spec("flat", "flatten")}, Shape{3, 2, 5}, 4);
  EXPECT_EQ(alone.output, 0) << Describe(alone);
  EXPECT_EQ(alone.input_grad, 0) << Describe(alone);
}

TEST(DropoutGPU, TrainingMaskEqualsCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // The same mask bit for bit: the outputs and gradients are products of the
  // same floats, so they match exactly.
  const auto c = CompareWithCpu({Spec("drop", "dropout", {{"p", 0.3}})}, Shape{4, 9}, 7, true);
  EXPECT_EQ(c.output, 0) << Describe(c);
  EXPECT_EQ(c.input_grad, 0) << Describe(c);
}

TEST(DropoutGPU, EvaluationIsTheIdentity) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const auto c = CompareWithCpu({Spec("drop", "dropout", {{"p", 0.5}})}, Shape{13}, 3, false);
  EXPECT_EQ(c.output, 0) << Describe(c);
  EXPECT_EQ(c.input_grad, 0) << Describe(c);
}

// One dropout layer of each class, built as a model would build them.
struct DropoutPair {
  std::unique_ptr<Layer> cpu, gpu;
};

DropoutPair MakeDropoutPair(double p, const Shape& sample) {
  const LayerType* t = LayerRegistry::Get().Find("dropout");
  if (t == nullptr || !t->create_cuda) throw Error("dropout has no CUDA class registered");
  Args args;
  args.Set("p", p);
  args.FillDefaults(t->schema);
  DropoutPair d{t->create("drop", args), t->create_cuda("drop", args)};
  d.cpu->Build({sample}, DType::kF32);
  d.gpu->Build({sample}, DType::kF32);
  d.gpu->MoveTo(kGpu);
  return d;
}

TEST(DropoutGPU, SampleIdsGiveTheCpuMask) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // 300 rows: more than one launch's table of ids; ids far apart, large and
  // repeated, so a mask keyed by the row number would differ.
  const Shape sample{37};
  const int64_t rows = 300;
  std::vector<int64_t> ids(rows);
  for (int64_t r = 0; r < rows; ++r)
    ids[r] = (r * 7919 + 13) % 1000003 + (r % 5 == 0 ? 50000000 : 0);
  ids[7] = ids[3];
  for (const double p : {0.1, 0.5, 0.9}) {
    DropoutPair d = MakeDropoutPair(p, sample);
    const Tensor x = RandomTensor(sample.WithBatch(rows), 21, -1, 1, DType::kF32);
    ForwardContext ctx;
    ctx.seed = 99;
    ctx.step = 12;
    ctx.sample_ids = ids.data();
    Tensor y_cpu = Tensor::Empty(x.shape());
    d.cpu->Forward({&x}, y_cpu, ctx);
    const Tensor xg = x.To(kGpu);
    Tensor y_gpu = Tensor::Empty(x.shape(), DType::kF32, kGpu);
    d.gpu->Forward({&xg}, y_gpu, ctx);
    const Tensor& mask_cpu = static_cast<DropoutLayer&>(*d.cpu).mask();
    const Tensor mask_gpu = static_cast<DropoutLayer&>(*d.gpu).mask().To(Device::Cpu());
    ASSERT_EQ(mask_gpu.shape(), mask_cpu.shape());
    int64_t differ = 0, first = -1, kept = 0;
    for (int64_t i = 0; i < mask_cpu.numel(); ++i) {
      if (mask_cpu.At(i) != mask_gpu.At(i)) {
        if (first < 0) first = i;
        ++differ;
      }
      kept += mask_cpu.At(i) != 0;
    }
    EXPECT_EQ(differ, 0) << "p " << p << ": " << differ << " mask elements differ, first at row "
                         << first / 37 << " element " << first % 37;
    // The mask is really random (not all kept or all dropped).
    EXPECT_GT(kept, 0) << "p " << p;
    EXPECT_LT(kept, mask_cpu.numel()) << "p " << p;
    EXPECT_EQ(NormalisedError(y_cpu, y_gpu), 0) << "p " << p;
    // Backward: dx = dy * mask, the same on both.
    const Tensor dy = RandomTensor(x.shape(), 22, -1, 1, DType::kF32);
    Tensor dx_cpu = Tensor::Empty(x.shape());
    Tensor dx_gpu = Tensor::Empty(x.shape(), DType::kF32, kGpu);
    const Tensor dyg = dy.To(kGpu);
    d.cpu->Backward({&x}, y_cpu, dy, {&dx_cpu});
    d.gpu->Backward({&xg}, y_gpu, dyg, {&dx_gpu});
    EXPECT_EQ(NormalisedError(dx_cpu, dx_gpu), 0) << "p " << p;
  }
}

TEST(LinearGPU, MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // A sample of rank 3 (F = 60 after the implicit flatten), odd sizes.
  const auto c = CompareWithCpu({Spec("fc", "linear", {{"out", int64_t{13}}})}, Shape{3, 4, 5}, 7);
  EXPECT_LE(c.output, 1e-4) << Describe(c);
  EXPECT_LE(c.input_grad, 1e-4) << Describe(c);
  EXPECT_LE(c.param_grad, 1e-4) << Describe(c);
}

TEST(LinearGPU, WithoutBiasAndStacked) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const auto c =
      CompareWithCpu({Spec("fc1", "linear", {{"out", int64_t{33}}, {"bias", false}}),
                      Spec("relu", "relu"), Spec("fc2", "linear", {{"out", int64_t{10}}})},
                     Shape{70}, 65);
  EXPECT_LE(c.output, 1e-4) << Describe(c);
  EXPECT_LE(c.input_grad, 1e-4) << Describe(c);
  EXPECT_LE(c.param_grad, 1e-4) << Describe(c);
}

TEST(LinearGPU, GradientsAccumulate) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // Two backward passes add: dW after two equals twice dW after one.
  auto gpu = Model::Build({Spec("fc", "linear", {{"out", int64_t{6}}})}, Shape{5}, DType::kF32, 3,
                          InitScheme::kPytorchDefault, kGpu);
  const Tensor x = RandomTensor(Shape{4, 5}, 4, -1, 1, DType::kF32).To(kGpu);
  const Tensor dy = RandomTensor(Shape{4, 6}, 5, -1, 1, DType::kF32).To(kGpu);
  ForwardContext ctx;
  gpu->ZeroGrad();
  gpu->Forward(x, ctx);
  gpu->Backward(dy, {});
  std::vector<Tensor> once;
  for (auto& np : gpu->NamedParameters()) once.push_back(np.param->grad.To(Device::Cpu()));
  gpu->Forward(x, ctx);
  gpu->Backward(dy, {});
  auto params = gpu->NamedParameters();
  ASSERT_EQ(params.size(), 2u);
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor twice = params[i].param->grad.To(Device::Cpu());
    for (int64_t k = 0; k < twice.numel(); ++k) {
      // Not bitwise: the bias adds the rows onto the first sum one by one.
      EXPECT_NEAR(twice.At(k), 2 * once[i].At(k), 1e-5) << params[i].name << " element " << k;
    }
  }
}

// ---------------------------------------------------------------- loss

void ExpectLossMatches(int64_t n, int64_t k, double grad_scale, double smoothing, uint64_t seed) {
  SCOPED_TRACE(StrCat("N ", n, " K ", k, " grad_scale ", grad_scale, " smoothing ", smoothing));
  Tensor logits = RandomTensor(Shape{n, k}, seed, -4, 4, DType::kF32);
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = (i * 5 + 3) % k;
  // Row 0: all equal (the argmax is the first, so label 0 is correct);
  // row 1: the label holds the max, so some rows are surely correct.
  for (int64_t j = 0; j < k; ++j) logits.Set(j, 0.25);
  labels[0] = 0;
  if (n > 1) logits.Set(k + labels[1], 10.0);
  Tensor d_cpu = Tensor::Empty(logits.shape());
  const LossResult cpu = SoftmaxCrossEntropy(logits, labels.data(), &d_cpu, grad_scale, smoothing);
  const Tensor lg = logits.To(kGpu);
  Tensor d_gpu = Tensor::Empty(logits.shape(), DType::kF32, kGpu);
  const DeviceLabels dl(labels);
  const LossResult gpu = cuda::SoftmaxCrossEntropy(lg, dl.get(), &d_gpu, grad_scale, smoothing);
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-9 * std::max(1.0, std::abs(cpu.loss))) << "loss";
  EXPECT_EQ(gpu.correct, cpu.correct) << "correct count";
  EXPECT_GE(cpu.correct, n > 1 ? 2 : 1);
  EXPECT_LE(NormalisedError(d_cpu, d_gpu), 1e-6) << "dlogits";
  // Without dlogits: the same loss.
  const LossResult no_grad =
      cuda::SoftmaxCrossEntropy(lg, dl.get(), nullptr, grad_scale, smoothing);
  EXPECT_EQ(no_grad.loss, gpu.loss);
  EXPECT_EQ(no_grad.correct, gpu.correct);
}

TEST(SoftmaxCrossEntropyGPU, MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  ExpectLossMatches(37, 10, -1, 0.0, 1);
  ExpectLossMatches(37, 10, 0.5, 0.1, 2);
  ExpectLossMatches(1, 3, -1, 0.2, 3);
  // K larger than a warp, N over many blocks.
  ExpectLossMatches(1000, 100, -1, 0.0, 4);
  ExpectLossMatches(257, 1001, 1.0 / 512, 0.3, 5);
}

TEST(SoftmaxCrossEntropyGPU, IsDeterministic) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const Tensor logits = RandomTensor(Shape{4099, 17}, 8, -3, 3, DType::kF32).To(kGpu);
  std::vector<int64_t> labels(4099);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 17);
  const DeviceLabels dl(labels);
  const LossResult a = cuda::SoftmaxCrossEntropy(logits, dl.get(), nullptr);
  for (int i = 0; i < 5; ++i) {
    const LossResult b = cuda::SoftmaxCrossEntropy(logits, dl.get(), nullptr);
    EXPECT_EQ(a.loss, b.loss) << "run " << i;  // bitwise
    EXPECT_EQ(a.correct, b.correct);
  }
}

TEST(SoftmaxCrossEntropyGPU, BadLabelNamesRowAndValue) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const Tensor logits = RandomTensor(Shape{12, 11}, 9, -1, 1, DType::kF32).To(kGpu);
  std::vector<int64_t> labels(12, 1);
  labels[5] = 11;  // == K
  labels[9] = -1;
  const DeviceLabels dl(labels);
  Tensor d = Tensor::Empty(logits.shape(), DType::kF32, kGpu);
  try {
    cuda::SoftmaxCrossEntropy(logits, dl.get(), &d);
    FAIL() << "an out-of-range label was not reported";
  } catch (const Error& e) {
    // The first bad row, as the CPU reports it.
    EXPECT_NE(std::string(e.what()).find("label 11 at index 5 is out of range [0, 11)"),
              std::string::npos)
        << e.what();
  }
  labels[5] = 1;
  const DeviceLabels negative(labels);
  try {
    cuda::SoftmaxCrossEntropy(logits, negative.get(), nullptr);
    FAIL() << "a negative label was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label -1 at index 9"), std::string::npos) << e.what();
  }
  // Labels left in pageable host memory are refused, not read by the kernel.
  EXPECT_THROW(cuda::SoftmaxCrossEntropy(logits, labels.data(), nullptr), Error);
  // The device is still usable afterwards.
  labels[9] = 2;
  const DeviceLabels good(labels);
  EXPECT_NO_THROW(cuda::SoftmaxCrossEntropy(logits, good.get(), &d));
}

// ---------------------------------------------------------------- optimizers

// Parameter sizes: odd ones, one over a chunk (16384), many small ones (more
// than a launch's table holds), and one over a launch's blocks (320 chunks).
std::vector<int64_t> ParamSizes(bool with_huge) {
  std::vector<int64_t> sizes = {1, 7, 16384, 16385, 70001, 3, 130};
  for (int i = 0; i < 60; ++i) sizes.push_back(1 + (i * 37) % 300);
  if (with_huge) sizes.push_back(320 * 16384 + 4099);
  return sizes;
}

// The same parameters twice, on the host and on the GPU.
struct ParamSet {
  std::vector<Parameter> cpu, gpu;
  explicit ParamSet(const std::vector<int64_t>& sizes) {
    cpu.reserve(sizes.size());
    gpu.reserve(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      const Tensor v = RandomTensor(Shape{sizes[i]}, 100 + i, -1, 1, DType::kF32);
      cpu.push_back({"weight", v, Tensor::Zeros(v.shape())});
      gpu.push_back({"weight", v.To(kGpu), Tensor::Zeros(v.shape(), DType::kF32, kGpu)});
    }
  }
  std::vector<NamedParameter> Named(std::vector<Parameter>& ps) {
    std::vector<NamedParameter> out;
    for (size_t i = 0; i < ps.size(); ++i) out.push_back({StrCat("p", i), &ps[i]});
    return out;
  }
  void SetGrads(uint64_t seed) {
    for (size_t i = 0; i < cpu.size(); ++i) {
      const Tensor g = RandomTensor(cpu[i].value.shape(), seed * 1000 + i, -1, 1, DType::kF32);
      cpu[i].grad.CopyFrom(g);
      gpu[i].grad.CopyFrom(g);
    }
  }
};

// Three steps on both; then every value and state tensor must agree.
void ExpectSameSteps(ParamSet& ps, Optimizer& on_cpu, Optimizer& on_gpu, double tol) {
  for (int step = 1; step <= 3; ++step) {
    ps.SetGrads(step);
    const double lr = 0.05 * step;  // the schedule changes lr between steps
    on_cpu.Step(lr);
    on_gpu.Step(lr);
  }
  for (size_t i = 0; i < ps.cpu.size(); ++i) {
    ASSERT_EQ(ps.gpu[i].value.device(), kGpu);
    EXPECT_LE(NormalisedError(ps.cpu[i].value, ps.gpu[i].value), tol)
        << "parameter p" << i << " of " << ps.cpu[i].value.numel() << " elements";
  }
  const auto sc = on_cpu.StateTensors();
  const auto sg = on_gpu.StateTensors();
  ASSERT_EQ(sc.size(), sg.size());
  for (size_t i = 0; i < sc.size(); ++i) {
    ASSERT_EQ(sc[i].first, sg[i].first);
    EXPECT_EQ(sg[i].second.device(), kGpu) << sg[i].first;
    EXPECT_LE(NormalisedError(sc[i].second, sg[i].second), tol) << "state " << sc[i].first;
  }
}

TEST(SgdGPU, FusedStepMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  struct Case {
    const char* what;
    SgdOptions o;
  };
  const std::vector<Case> cases = {
      {"plain", {0, 0, false, 0}},
      {"momentum", {0.9, 0, false, 0}},
      {"momentum + dampening + weight decay", {0.8, 0.3, false, 0.01}},
      {"nesterov + weight decay", {0.9, 0, true, 0.05}},
      {"weight decay, no momentum", {0, 0, false, 0.1}},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE(cases[k].what);
    ParamSet ps(ParamSizes(/*with_huge=*/k == 1));
    Sgd on_cpu(ps.Named(ps.cpu), cases[k].o);
    Sgd on_gpu(ps.Named(ps.gpu), cases[k].o);
    ExpectSameSteps(ps, on_cpu, on_gpu, 1e-5);
    EXPECT_EQ(on_gpu.StateTensors().size(), cases[k].o.momentum != 0 ? ps.gpu.size() : 0u);
  }
}

TEST(SgdGPU, HostStateFromACheckpointMovesToTheGpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  ParamSet ps({5, 17});
  const SgdOptions o{0.9, 0, false, 0};
  Sgd on_cpu(ps.Named(ps.cpu), o);
  Sgd on_gpu(ps.Named(ps.gpu), o);
  // A momentum buffer restored from host tensors: not the first step any more.
  std::vector<std::pair<std::string, Tensor>> state;
  for (size_t i = 0; i < ps.cpu.size(); ++i) {
    state.emplace_back(StrCat("p", i, ".momentum_buffer"),
                       RandomTensor(ps.cpu[i].value.shape(), 50 + i, -1, 1, DType::kF32));
  }
  ASSERT_EQ(on_cpu.LoadStateTensors(state), 2);
  ASSERT_EQ(on_gpu.LoadStateTensors(state), 2);
  ExpectSameSteps(ps, on_cpu, on_gpu, 1e-5);
}

TEST(AdamGPU, FusedStepMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  for (const bool decoupled : {false, true}) {
    for (const double wd : {0.0, 0.02}) {
      SCOPED_TRACE(StrCat(decoupled ? "adamw" : "adam", " weight decay ", wd));
      ParamSet ps(ParamSizes(/*with_huge=*/decoupled && wd > 0));
      AdamOptions o;
      o.weight_decay = wd;
      Adam on_cpu(ps.Named(ps.cpu), o, decoupled);
      Adam on_gpu(ps.Named(ps.gpu), o, decoupled);
      ExpectSameSteps(ps, on_cpu, on_gpu, 1e-5);
      EXPECT_EQ(on_gpu.StateTensors().size(), 2 * ps.gpu.size());
    }
  }
}

TEST(AdamGPU, AdamWClassAndBetas) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  ParamSet ps({33, 16384 * 2 + 1});
  AdamOptions o;
  o.beta1 = 0.5;
  o.beta2 = 0.9;
  o.eps = 1e-6;
  o.weight_decay = 0.1;
  AdamW on_cpu(ps.Named(ps.cpu), o);
  AdamW on_gpu(ps.Named(ps.gpu), o);
  ExpectSameSteps(ps, on_cpu, on_gpu, 1e-5);
}

TEST(OptimizerKernelsGPU, DirectCallsMatchTheFormulas) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // One element, worked by hand: SGD with momentum 0.5 from buf = 2 (not
  // first): buf = 0.5 * 2 + 1 * g = 1 + 0.5 = 1.5, p = 1 - 0.1 * 1.5 = 0.85.
  Tensor p = Tensor::Full(Shape{1}, 1.0).To(kGpu);
  Tensor g = Tensor::Full(Shape{1}, 0.5).To(kGpu);
  Tensor buf = Tensor::Full(Shape{1}, 2.0).To(kGpu);
  ParamSlot s;
  s.value = p.data<float>();
  s.grad = g.data<float>();
  s.state0 = buf.data<float>();
  s.numel = 1;
  cuda::SgdStep(kGpu, {s}, 0.1, 0.5, 0.0, false, 0.0);
  EXPECT_FLOAT_EQ(p.To(Device::Cpu()).At(0), 0.85f);
  EXPECT_FLOAT_EQ(buf.To(Device::Cpu()).At(0), 1.5f);
  // first: buf = g = 0.5, p = 0.85 - 0.1 * 0.5 = 0.8.
  s.first = true;
  cuda::SgdStep(kGpu, {s}, 0.1, 0.5, 0.0, false, 0.0);
  EXPECT_FLOAT_EQ(p.To(Device::Cpu()).At(0), 0.8f);
  EXPECT_FLOAT_EQ(buf.To(Device::Cpu()).At(0), 0.5f);
  // An empty slot list and zero-size slots are no-ops.
  EXPECT_NO_THROW(cuda::SgdStep(kGpu, {}, 0.1, 0, 0, false, 0));
  ParamSlot empty;
  EXPECT_NO_THROW(cuda::AdamStep(kGpu, {empty}, 0.1, 0.9, 0.999, 1e-8, 0, false, 1));
  // Adam's first step moves each element by about lr against its gradient's sign.
  Tensor m = Tensor::Zeros(Shape{1}, DType::kF32, kGpu);
  Tensor v = Tensor::Zeros(Shape{1}, DType::kF32, kGpu);
  s.state0 = m.data<float>();
  s.state1 = v.data<float>();
  cuda::AdamStep(kGpu, {s}, 0.01, 0.9, 0.999, 1e-8, 0, false, 1);
  EXPECT_NEAR(p.To(Device::Cpu()).At(0), 0.8 - 0.01, 1e-6);
}

// ---------------------------------------------------------------- Axpy, Scale

TEST(AxpyScaleGPU, MatchHost) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  for (const int64_t n : {int64_t{1}, int64_t{6}, int64_t{1001}, int64_t{1} << 20}) {
    SCOPED_TRACE(StrCat("n ", n));
    const Tensor x = RandomTensor(Shape{n}, 1, -1, 1, DType::kF32);
    const Tensor y = RandomTensor(Shape{n}, 2, -1, 1, DType::kF32);
    Tensor yg = y.To(kGpu);
    cuda::Axpy(-0.75f, x.To(kGpu), yg);
    cuda::Scale(yg, 3.0f);
    const Tensor got = yg.To(Device::Cpu());
    for (int64_t i = 0; i < n; ++i) {
      const float want =
          (static_cast<float>(y.At(i)) + -0.75f * static_cast<float>(x.At(i))) * 3.0f;
      ASSERT_NEAR(got.At(i), want, 1e-6) << "element " << i;
    }
  }
}

TEST(AxpyScaleGPU, UnalignedViews) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // Rows 1.. of a [5, 3] tensor start 12 bytes in: not float4-aligned.
  const Tensor x = RandomTensor(Shape{5, 3}, 3, -1, 1, DType::kF32);
  const Tensor y = RandomTensor(Shape{5, 3}, 4, -1, 1, DType::kF32);
  const Tensor xg = x.To(kGpu);
  Tensor yg = y.To(kGpu);
  Tensor ys = yg.Slice(1, 5);
  cuda::Axpy(2.0f, xg.Slice(0, 4), ys);
  cuda::Scale(ys, 0.5f);
  const Tensor got = yg.To(Device::Cpu());
  for (int64_t i = 0; i < 15; ++i) {
    const float want =
        i < 3 ? static_cast<float>(y.At(i))
              : (static_cast<float>(y.At(i)) + 2.0f * static_cast<float>(x.At(i - 3))) * 0.5f;
    EXPECT_NEAR(got.At(i), want, 1e-6) << "element " << i;
  }
}

TEST(AxpyScaleGPU, RejectHostAndF64Tensors) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  Tensor host = Tensor::Zeros(Shape{4});
  Tensor gpu = Tensor::Zeros(Shape{4}, DType::kF32, kGpu);
  EXPECT_THROW(cuda::Axpy(1.0f, host, gpu), Error);
  EXPECT_THROW(cuda::Scale(host, 2.0f), Error);
  Tensor f64 = Tensor::Zeros(Shape{4}, DType::kF64, kGpu);
  EXPECT_THROW(cuda::Scale(f64, 2.0f), Error);
  Tensor other = Tensor::Zeros(Shape{5}, DType::kF32, kGpu);
  EXPECT_THROW(cuda::Axpy(1.0f, other, gpu), Error);
}

// ---------------------------------------------------------------- mixed precision

// Host references of f32 <-> f16 / bf16 (round to nearest even), written
// from the formats' definitions, independent of CUDA's conversions.
uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t HostToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);  // stays a (quiet) NaN
  // Add just under half an ulp, plus one when the kept part is odd: ties to even.
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
float HostFromBf16(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

uint16_t HostToF16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7fffffff;
  if (a > 0x7f800000) return sign | 0x7e00;   // NaN
  if (a >= 0x477ff000) return sign | 0x7c00;  // >= 65520 (half-way above 65504): inf
  if (a < 0x38800000) {
    // Below 2^-14: a multiple of 2^-24 (subnormal; 0x400 is the smallest
    // normal, whose encoding follows on). x * 2^24 is exact; nearbyint
    // rounds half to even in the default rounding mode.
    const float units = std::nearbyint(BitsFloat(a) * 16777216.0f);
    return sign | static_cast<uint16_t>(units);
  }
  const uint32_t exp = (a >> 23) - 127 + 15, mant = a & 0x7fffff;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // a carry moves into the exponent
  return sign | static_cast<uint16_t>(h);
}
float HostFromF16(uint16_t h) {
  const float sign = (h & 0x8000) ? -1.f : 1.f;
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -24);
  if (exp == 31) return mant ? std::numeric_limits<float>::quiet_NaN() : sign * INFINITY;
  return sign * std::ldexp(static_cast<float>(1024 + mant), exp - 25);
}

uint16_t HostTo(DType t, float f) { return t == DType::kF16 ? HostToF16(f) : HostToBf16(f); }
float HostFrom(DType t, uint16_t h) { return t == DType::kF16 ? HostFromF16(h) : HostFromBf16(h); }

// The references themselves, on known values (CPU: runs everywhere).
TEST(HalfReference, KnownValues) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  EXPECT_EQ(HostToF16(1.0f), 0x3c00);
  EXPECT_EQ(HostToF16(-2.0f), 0xc000);
  EXPECT_EQ(HostToF16(65504.0f), 0x7bff);
  EXPECT_EQ(HostToF16(65519.0f), 0x7bff);
  EXPECT_EQ(HostToF16(65520.0f), 0x7c00);
  EXPECT_EQ(HostToF16(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(HostToF16(std::ldexp(1.0f, -25)), 0x0000);         // a tie: to even (0)
  EXPECT_EQ(HostToF16(std::ldexp(3.0f, -25)), 0x0002);         // 1.5 units: to even (2)
  EXPECT_EQ(HostToF16(std::ldexp(1023.5f, -24)), 0x0400);      // rounds up to the smallest normal
  EXPECT_EQ(HostToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // a tie: to even
  EXPECT_EQ(HostToF16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // a tie: to even (up)
  EXPECT_EQ(HostToF16(2047.5f), 0x6800);                       // carry into the exponent: 2048
  EXPECT_TRUE(std::isnan(HostFromF16(HostToF16(NAN))));
  EXPECT_EQ(HostToBf16(1.0f), 0x3f80);
  EXPECT_EQ(HostToBf16(BitsFloat(0x3f808000)), 0x3f80);  // a tie: to even
  EXPECT_EQ(HostToBf16(BitsFloat(0x3f818000)), 0x3f82);  // a tie: to even (up)
  EXPECT_EQ(HostToBf16(BitsFloat(0x3f808001)), 0x3f81);
  EXPECT_EQ(HostToBf16(BitsFloat(0x7f7fffff)), 0x7f80);  // FLT_MAX: inf
  EXPECT_TRUE(std::isnan(HostFromBf16(HostToBf16(NAN))));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    if (!std::isnan(HostFromF16(b))) {
      ASSERT_EQ(HostToF16(HostFromF16(b)), b) << "f16 " << h;
    }
    if (!std::isnan(HostFromBf16(b))) {
      ASSERT_EQ(HostToBf16(HostFromBf16(b)), b) << "bf16 " << h;
    }
  }
  EXPECT_EQ(HostFromF16(0x3555), 0.333251953125f);
}

// Host bits <-> GPU tensors of any 2-byte or 4-byte type.
Tensor Upload16(const std::vector<uint16_t>& bits, DType t) {
  Tensor g = Tensor::Empty(Shape{static_cast<int64_t>(bits.size())}, t, kGpu);
  CopyBytes(kGpu, g.raw_data(), Device::Cpu(), bits.data(), bits.size() * 2);
  return g;
}
std::vector<uint16_t> Download16(const Tensor& g) {
  std::vector<uint16_t> bits(static_cast<size_t>(g.numel()));
  CopyBytes(Device::Cpu(), bits.data(), g.device(), g.raw_data(), bits.size() * 2);
  return bits;
}
Tensor UploadF32(const std::vector<float>& v) {
  Tensor g = Tensor::Empty(Shape{static_cast<int64_t>(v.size())}, DType::kF32, kGpu);
  CopyBytes(kGpu, g.raw_data(), Device::Cpu(), v.data(), v.size() * 4);
  return g;
}
std::vector<float> DownloadF32(const Tensor& g) {
  std::vector<float> v(static_cast<size_t>(g.numel()));
  CopyBytes(Device::Cpu(), v.data(), g.device(), g.raw_data(), v.size() * 4);
  return v;
}

// f32 values that exercise rounding: ties, subnormals, overflow, specials,
// and random values of many magnitudes.
std::vector<float> CastProbe() {
  std::vector<float> v = {0.f,
                          -0.f,
                          1.f,
                          -1.f,
                          65504.f,
                          65519.f,
                          65520.f,
                          1e6f,
                          -1e30f,
                          std::ldexp(1.f, -24),
                          std::ldexp(1.f, -25),
                          std::ldexp(3.f, -25),
                          std::ldexp(1023.5f, -24),
                          1.f + std::ldexp(1.f, -11),
                          1.f + std::ldexp(3.f, -11),
                          BitsFloat(0x3f808000),
                          BitsFloat(0x3f818000),
                          BitsFloat(0x7f7fffff),
                          std::ldexp(1.f, -130),
                          INFINITY,
                          -INFINITY,
                          NAN};
  const Tensor r = RandomTensor(Shape{5000}, 77, -1, 1, DType::kF32);
  for (int64_t i = 0; i < r.numel(); ++i) {
    v.push_back(static_cast<float>(r.At(i)) * std::ldexp(1.f, static_cast<int>(i % 60) - 30));
  }
  return v;
}

TEST(CastGPU, F32ToHalfMatchesHostRounding) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const std::vector<float> v = CastProbe();
  const Tensor src = UploadF32(v);
  for (const DType t : {DType::kF16, DType::kBF16}) {
    Tensor dst = Tensor::Empty(src.shape(), t, kGpu);
    cuda::Cast(src, dst);
    const std::vector<uint16_t> got = Download16(dst);
    for (size_t i = 0; i < v.size(); ++i) {
      if (std::isnan(v[i])) {
        EXPECT_TRUE(std::isnan(HostFrom(t, got[i]))) << DTypeName(t) << " of NaN";
        continue;
      }
      ASSERT_EQ(got[i], HostTo(t, v[i])) << DTypeName(t) << " of " << v[i] << " (bits 0x"
                                         << std::hex << FloatBits(v[i]) << ") at " << std::dec << i;
    }
  }
}

TEST(CastGPU, EveryHalfValueToF32AndBack) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
  for (const DType t : {DType::kF16, DType::kBF16}) {
    const Tensor half = Upload16(all, t);
    Tensor f = Tensor::Empty(half.shape(), DType::kF32, kGpu);
    cuda::Cast(half, f);
    Tensor back = Tensor::Empty(half.shape(), t, kGpu);
    cuda::Cast(f, back);
    const std::vector<float> wide = DownloadF32(f);
    const std::vector<uint16_t> again = Download16(back);
    for (uint32_t h = 0; h < 0x10000; ++h) {
      const float want = HostFrom(t, all[h]);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(wide[h])) << DTypeName(t) << " 0x" << std::hex << h;
        continue;
      }
      ASSERT_EQ(FloatBits(wide[h]), FloatBits(want)) << DTypeName(t) << " 0x" << std::hex << h;
      ASSERT_EQ(again[h], all[h]) << DTypeName(t) << " round trip of 0x" << std::hex << h;
    }
  }
}

TEST(CastGPU, HalfToHalfAndSameType) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
  for (const DType from : {DType::kF16, DType::kBF16}) {
    const DType to = from == DType::kF16 ? DType::kBF16 : DType::kF16;
    const Tensor src = Upload16(all, from);
    Tensor dst = Tensor::Empty(src.shape(), to, kGpu);
    cuda::Cast(src, dst);
    const std::vector<uint16_t> got = Download16(dst);
    for (uint32_t h = 0; h < 0x10000; ++h) {
      const float v = HostFrom(from, all[h]);  // exact in f32, so one rounding
      if (std::isnan(v)) continue;
      ASSERT_EQ(got[h], HostTo(to, v))
          << DTypeName(from) << " 0x" << std::hex << h << " to " << DTypeName(to);
    }
    // Same type: a copy.
    Tensor same = Tensor::Empty(src.shape(), from, kGpu);
    cuda::Cast(src, same);
    EXPECT_EQ(Download16(same), all) << DTypeName(from);
  }
  // Mismatched sizes and f64 are refused.
  Tensor a = Tensor::Zeros(Shape{4}, DType::kF32, kGpu);
  Tensor b = Tensor::Empty(Shape{5}, DType::kF16, kGpu);
  EXPECT_THROW(cuda::Cast(a, b), Error);
  Tensor d = Tensor::Zeros(Shape{4}, DType::kF64, kGpu);
  EXPECT_THROW(cuda::Cast(d, a), Error);
}

TEST(AddCastGPU, AddsHalfAndF32IntoF32) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const int64_t n = 70003;
  const Tensor base = RandomTensor(Shape{n}, 31, -2, 2, DType::kF32);
  const Tensor add = RandomTensor(Shape{n}, 32, -2, 2, DType::kF32);
  std::vector<float> b(n), a(n);
  for (int64_t i = 0; i < n; ++i) {
    b[i] = static_cast<float>(base.At(i));
    a[i] = static_cast<float>(add.At(i));
  }
  for (const DType t : {DType::kF16, DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(t));
    Tensor dst = UploadF32(b);
    std::vector<float> src_value(n);
    Tensor src;
    if (t == DType::kF32) {
      src_value = a;
      src = UploadF32(a);
    } else {
      std::vector<uint16_t> bits(n);
      for (int64_t i = 0; i < n; ++i) {
        bits[i] = HostTo(t, a[i]);
        src_value[i] = HostFrom(t, bits[i]);
      }
      src = Upload16(bits, t);
    }
    cuda::AddCast(src, dst);
    cuda::AddCast(src, dst);  // adds, not overwrites
    const std::vector<float> got = DownloadF32(dst);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[i], (b[i] + src_value[i]) + src_value[i]) << "element " << i;
    }
  }
  Tensor half_dst = Tensor::Zeros(Shape{3}, DType::kF16, kGpu);
  EXPECT_THROW(cuda::AddCast(Tensor::Zeros(Shape{3}, DType::kF32, kGpu), half_dst), Error);
}

// Gradients of many sizes: over a chunk (16384), more tensors than one
// launch's table (110).
std::vector<int64_t> UnscaleSizes() {
  std::vector<int64_t> sizes = {1, 7, 16384, 70001, 3};
  for (int i = 0; i < 130; ++i) sizes.push_back(1 + (i * 53) % 257);
  return sizes;
}

struct GradSet {
  std::vector<std::vector<float>> host;
  std::vector<Tensor> gpu;
  explicit GradSet(const std::vector<int64_t>& sizes) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      const Tensor r = RandomTensor(Shape{sizes[i]}, 400 + i, -1000, 1000, DType::kF32);
      std::vector<float> v(sizes[i]);
      for (int64_t k = 0; k < sizes[i]; ++k) v[k] = static_cast<float>(r.At(k));
      host.push_back(v);
    }
  }
  void Upload() {
    gpu.clear();
    for (const auto& v : host) gpu.push_back(UploadF32(v));
  }
  std::vector<Tensor*> Pointers() {
    std::vector<Tensor*> p;
    for (Tensor& t : gpu) p.push_back(&t);
    return p;
  }
  // Every element (finite or not) is the host value times inv_scale.
  void ExpectScaled(float inv_scale) const {
    for (size_t i = 0; i < gpu.size(); ++i) {
      const std::vector<float> got = DownloadF32(gpu[i]);
      for (size_t k = 0; k < got.size(); ++k) {
        const float want = host[i][k] * inv_scale;
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got[k])) << "tensor " << i << " element " << k;
        } else {
          ASSERT_EQ(got[k], want) << "tensor " << i << " element " << k << " of " << got.size();
        }
      }
    }
  }
};

TEST(UnscaleGPU, FiniteGradientsAreScaledExactly) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  for (const float inv_scale : {1.0f / 65536, 0.3f, 1.0f}) {
    SCOPED_TRACE(StrCat("inv_scale ", inv_scale));
    GradSet g(UnscaleSizes());
    g.Upload();
    EXPECT_FALSE(cuda::UnscaleAndFindNonFinite(g.Pointers(), inv_scale));
    g.ExpectScaled(inv_scale);
  }
  EXPECT_FALSE(cuda::UnscaleAndFindNonFinite({}, 0.5f));
}

TEST(UnscaleGPU, FindsInfAndNanAnywhere) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const std::vector<int64_t> sizes = UnscaleSizes();
  struct Where {
    size_t tensor;
    int64_t element;
  };
  // The first element; beyond the first chunk of a tensor; the last element
  // of a tensor in the second launch (tensor index > 110).
  const std::vector<Where> places = {
      {0, 0}, {3, 70000}, {3, 16384}, {2, 16383}, {sizes.size() - 1, sizes.back() - 1}, {120, 0}};
  const float inv_scale = 1.0f / 1024;
  for (const Where& w : places) {
    for (const float bad : {INFINITY, -INFINITY, NAN}) {
      SCOPED_TRACE(StrCat(bad, " in tensor ", w.tensor, " element ", w.element));
      GradSet g(sizes);
      g.host[w.tensor][w.element] = bad;
      g.Upload();
      EXPECT_TRUE(cuda::UnscaleAndFindNonFinite(g.Pointers(), inv_scale));
      // PyTorch's semantics: everything is multiplied even so.
      g.ExpectScaled(inv_scale);
      // The flag does not stick: the same (finite) gradients again are clean.
      g.host[w.tensor][w.element] = 1.0f;
      g.Upload();
      EXPECT_FALSE(cuda::UnscaleAndFindNonFinite(g.Pointers(), inv_scale));
    }
  }
  Tensor host = Tensor::Zeros(Shape{3});
  EXPECT_THROW(cuda::UnscaleAndFindNonFinite({&host}, 1.0f), Error);
  Tensor half = Tensor::Zeros(Shape{3}, DType::kF16, kGpu);
  EXPECT_THROW(cuda::UnscaleAndFindNonFinite({&half}, 1.0f), Error);
}

TEST(AxpyHalfGPU, MatchesHostRounding) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  // alpha * x is exact in f32 for a half x and alpha = -0.75, so the sum is
  // rounded once to f32 and once to the type on both sides: bitwise equal.
  const float alpha = -0.75f;
  for (const DType t : {DType::kF16, DType::kBF16}) {
    for (const int64_t n : {int64_t{1}, int64_t{1001}, (int64_t{1} << 16) + 3}) {
      SCOPED_TRACE(StrCat(DTypeName(t), " n ", n));
      const Tensor xr = RandomTensor(Shape{n}, 61, -8, 8, DType::kF32);
      const Tensor yr = RandomTensor(Shape{n}, 62, -8, 8, DType::kF32);
      std::vector<uint16_t> xb(n), yb(n);
      for (int64_t i = 0; i < n; ++i) {
        xb[i] = HostTo(t, static_cast<float>(xr.At(i)));
        yb[i] = HostTo(t, static_cast<float>(yr.At(i)));
      }
      const Tensor x = Upload16(xb, t);
      Tensor y = Upload16(yb, t);
      cuda::Axpy(alpha, x, y);
      const std::vector<uint16_t> got = Download16(y);
      for (int64_t i = 0; i < n; ++i) {
        const float want = HostFrom(t, yb[i]) + alpha * HostFrom(t, xb[i]);
        ASSERT_EQ(got[i], HostTo(t, want)) << "element " << i;
      }
    }
  }
  // x and y of different types are refused.
  Tensor y32 = Tensor::Zeros(Shape{4}, DType::kF32, kGpu);
  EXPECT_THROW(cuda::Axpy(1.0f, Tensor::Zeros(Shape{4}, DType::kF16, kGpu), y32), Error);
}

void ExpectHalfLossMatches(DType t, int64_t n, int64_t k, double grad_scale, double smoothing,
                           uint64_t seed) {
  SCOPED_TRACE(StrCat(DTypeName(t), " N ", n, " K ", k, " grad_scale ", grad_scale, " smoothing ",
                      smoothing));
  const Tensor raw = RandomTensor(Shape{n, k}, seed, -4, 4, DType::kF32);
  // The CPU gets the rounded values the GPU reads.
  std::vector<uint16_t> bits(n * k);
  Tensor logits = Tensor::Empty(Shape{n, k});
  for (int64_t i = 0; i < n * k; ++i) {
    bits[i] = HostTo(t, static_cast<float>(raw.At(i)));
    logits.Set(i, HostFrom(t, bits[i]));
  }
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = (i * 5 + 3) % k;
  Tensor d_cpu = Tensor::Empty(logits.shape());
  const LossResult cpu = SoftmaxCrossEntropy(logits, labels.data(), &d_cpu, grad_scale, smoothing);
  const Tensor lg = Upload16(bits, t).Reshape(Shape{n, k});
  Tensor d_gpu = Tensor::Empty(Shape{n, k}, t, kGpu);
  const DeviceLabels dl(labels);
  const LossResult gpu = cuda::SoftmaxCrossEntropy(lg, dl.get(), &d_gpu, grad_scale, smoothing);
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-9 * std::max(1.0, std::abs(cpu.loss))) << "loss";
  EXPECT_EQ(gpu.correct, cpu.correct) << "correct count";
  // dlogits: the CPU's f32 value rounded to the type, within one unit in the
  // last place of the type (a double -> f32 -> half rounding may differ by one).
  const std::vector<uint16_t> got = Download16(d_gpu);
  const float ulp = t == DType::kF16 ? std::ldexp(1.f, -10) : std::ldexp(1.f, -7);
  const float tiny = t == DType::kF16 ? std::ldexp(1.f, -24) : 0.f;
  for (int64_t i = 0; i < n * k; ++i) {
    const float want = static_cast<float>(d_cpu.At(i));
    ASSERT_LE(std::abs(HostFrom(t, got[i]) - want), ulp * std::abs(want) + tiny)
        << "dlogits row " << i / k << " column " << i % k << ": GPU " << HostFrom(t, got[i])
        << ", CPU " << want;
  }
}

TEST(SoftmaxCrossEntropyGPU, HalfLogitsMatchCpuOnTheRoundedValues) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  for (const DType t : {DType::kF16, DType::kBF16}) {
    ExpectHalfLossMatches(t, 37, 10, -1, 0.0, 1);
    ExpectHalfLossMatches(t, 257, 1001, 1.0 / 512, 0.3, 5);
    ExpectHalfLossMatches(t, 1000, 100, 1024.0 / 1000, 0.1, 4);  // a loss scale in the gradient
  }
  // dlogits of another type than the logits are refused.
  const Tensor lg = Tensor::Zeros(Shape{2, 3}, DType::kBF16, kGpu);
  Tensor d = Tensor::Empty(Shape{2, 3}, DType::kF32, kGpu);
  const DeviceLabels dl({0, 1});
  EXPECT_THROW(cuda::SoftmaxCrossEntropy(lg, dl.get(), &d), Error);
}

// Each layer in bf16 and f16 against the CPU in f32 (the contract's
// thresholds: ~3e-2 for bf16, ~5e-3 for f16, normalised).
double HalfTolerance(DType t) { return t == DType::kBF16 ? 3e-2 : 5e-3; }

class HalfLayersGPU : public ::testing::TestWithParam<DType> {};

TEST_P(HalfLayersGPU, Relu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  const auto c = CompareWithCpu({Spec("relu1", "relu")}, Shape{3, 7}, 5, true, 5, t);
  EXPECT_LE(c.output, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.input_grad, HalfTolerance(t)) << Describe(c);
}

TEST_P(HalfLayersGPU, ResidualAdd) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  const auto c = CompareWithCpu(
      {Spec("fc1", "linear", {{"out", int64_t{9}}}), Spec("relu1", "relu"),
       Spec("fc2", "linear", {{"out", int64_t{9}}}), Spec("sum", "add", {}, {"fc2", "fc1"}),
       Spec("fc3", "linear", {{"out", int64_t{4}}})},
      Shape{11}, 6, true, 5, t);
  EXPECT_LE(c.output, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.input_grad, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.param_grad, HalfTolerance(t)) << Describe(c);
}

TEST_P(HalfLayersGPU, FlattenAndLinear) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  const auto c =
      CompareWithCpu({Spec("flat", "flatten"), Spec("fc", "linear", {{"out", int64_t{13}}})},
                     Shape{3, 4, 5}, 7, true, 5, t);
  EXPECT_LE(c.output, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.input_grad, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.param_grad, HalfTolerance(t)) << Describe(c);
}

TEST_P(HalfLayersGPU, LinearWithoutBiasStacked) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  // Sizes that are multiples of 8 and not (tensor-core and fallback paths).
  const auto c =
      CompareWithCpu({Spec("fc1", "linear", {{"out", int64_t{64}}, {"bias", false}}),
                      Spec("relu", "relu"), Spec("fc2", "linear", {{"out", int64_t{10}}})},
                     Shape{72}, 65, true, 5, t);
  EXPECT_LE(c.output, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.input_grad, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.param_grad, HalfTolerance(t)) << Describe(c);
}

TEST_P(HalfLayersGPU, LinearEvalForward) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  const auto c =
      CompareWithCpu({Spec("fc", "linear", {{"out", int64_t{8}}})}, Shape{16}, 4, false, 9, t);
  EXPECT_LE(c.output, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.param_grad, HalfTolerance(t)) << Describe(c);
}

TEST_P(HalfLayersGPU, DropoutTrainingAndEval) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  const auto c =
      CompareWithCpu({Spec("drop", "dropout", {{"p", 0.3}})}, Shape{4, 9}, 7, true, 5, t);
  EXPECT_LE(c.output, HalfTolerance(t)) << Describe(c);
  EXPECT_LE(c.input_grad, HalfTolerance(t)) << Describe(c);
  const auto e = CompareWithCpu({Spec("drop", "dropout", {{"p", 0.5}})}, Shape{13}, 3, false, 5, t);
  EXPECT_LE(e.output, HalfTolerance(t)) << Describe(e);
  EXPECT_LE(e.input_grad, HalfTolerance(t)) << Describe(e);
}

TEST_P(HalfLayersGPU, DropoutKeepsTheCpuDecisions) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  const Shape sample{37};
  const int64_t rows = 300;
  std::vector<int64_t> ids(rows);
  for (int64_t r = 0; r < rows; ++r) ids[r] = (r * 7919 + 13) % 1000003;
  DropoutPair d = MakeDropoutPair(0.4, sample);
  const Tensor x = RandomTensor(sample.WithBatch(rows), 21, -1, 1, DType::kF32);
  for (const bool with_ids : {false, true}) {
    SCOPED_TRACE(with_ids ? "sample ids" : "no sample ids");
    ForwardContext ctx;
    ctx.seed = 99;
    ctx.step = 12;
    ctx.sample_ids = with_ids ? ids.data() : nullptr;
    Tensor y_cpu = Tensor::Empty(x.shape());
    d.cpu->Forward({&x}, y_cpu, ctx);
    Tensor xh = Tensor::Empty(x.shape(), t, kGpu);
    cuda::Cast(x.To(kGpu), xh);
    Tensor yh = Tensor::Empty(x.shape(), t, kGpu);
    d.gpu->Forward({&xh}, yh, ctx);
    const Tensor& mask_cpu = static_cast<DropoutLayer&>(*d.cpu).mask();
    const Tensor& mask_gpu = static_cast<DropoutLayer&>(*d.gpu).mask();
    ASSERT_EQ(mask_gpu.dtype(), t);
    const std::vector<uint16_t> m = Download16(mask_gpu);
    const std::vector<uint16_t> y = Download16(yh);
    int64_t differ = 0, first = -1;
    for (int64_t i = 0; i < x.numel(); ++i) {
      if ((mask_cpu.At(i) != 0) != (HostFrom(t, m[i]) != 0)) {
        if (first < 0) first = i;
        ++differ;
      }
      // y = the rounded x times the f32 scale, rounded once.
      const float xr = HostFrom(t, HostTo(t, static_cast<float>(x.At(i))));
      const uint16_t want = HostTo(t, xr * static_cast<float>(mask_cpu.At(i)));
      ASSERT_EQ(y[i], want) << "y element " << i;
    }
    EXPECT_EQ(differ, 0) << differ << " keep/drop decisions differ, first at " << first;
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, HalfLayersGPU, ::testing::Values(DType::kF16, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(DTypeName(i.param));
                         });

// ---------------------------------------------------------------- async loss, staging, idle

// Labels in the memory of GPU `device`.
struct LabelsOn {
  LabelsOn(int device, const std::vector<int64_t>& host)
      : storage(Device::Cuda(device), std::max<size_t>(1, host.size()) * sizeof(int64_t)) {
    CopyBytes(Device::Cuda(device), storage.data(), Device::Cpu(), host.data(),
              host.size() * sizeof(int64_t));
  }
  const int64_t* get() const { return static_cast<const int64_t*>(storage.data()); }
  Storage storage;
};

// Many losses in flight at once, on every GPU in turn, read back in reverse
// order: each must be its own (the pinned result slots and their events are
// reused, per device: an event recorded on another GPU's stream fails).
TEST(SoftmaxCrossEntropyGPU, AsyncResultsInFlightOnEveryGpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const int gpus = CudaDeviceCount();
  const int64_t n = 33, k = 7;
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = (i * 3) % k;
  std::vector<std::unique_ptr<LabelsOn>> dl;
  for (int d = 0; d < gpus; ++d) dl.push_back(std::make_unique<LabelsOn>(d, labels));
  for (int round = 0; round < 2; ++round) {  // round 1 reuses the slots of round 0
    std::vector<LossResult> want;
    std::vector<std::unique_ptr<cuda::PendingLoss>> pending;
    for (int i = 0; i < 12; ++i) {
      const int d = i % gpus;
      const Tensor logits = RandomTensor(Shape{n, k}, 100 + i, -3 + i, 3 + 2 * i, DType::kF32);
      want.push_back(SoftmaxCrossEntropy(logits, labels.data(), nullptr));
      pending.push_back(cuda::SoftmaxCrossEntropyAsync(logits.To(Device::Cuda(d)),
                                                       dl[d]->get(), nullptr));
    }
    for (int i = 11; i >= 0; --i) {
      const LossResult got = pending[i]->Get();
      EXPECT_NEAR(got.loss, want[i].loss, 1e-9 * std::max(1.0, std::abs(want[i].loss)))
          << "round " << round << ", loss " << i << " on cuda:" << i % gpus;
      EXPECT_EQ(got.correct, want[i].correct) << "round " << round << ", loss " << i;
      EXPECT_EQ(pending[i]->Get().loss, got.loss) << "a second Get differs";
    }
  }
  if (gpus < 2) GTEST_SKIP() << "one GPU: the cross-device part (labels on cuda:1) is skipped";
  const Tensor logits = RandomTensor(Shape{n, k}, 5, -1, 1, DType::kF32).To(Device::Cuda(0));
  try {
    cuda::SoftmaxCrossEntropy(logits, dl[1]->get(), nullptr);
    FAIL() << "labels on cuda:1 were accepted for logits on cuda:0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("are on cuda:1"), std::string::npos) << e.what();
  }
}

// Host rows staged to the GPU, read there on the compute stream: every batch
// arrives intact, and a slot released behind a long queue of compute work is
// not overwritten by the next batch's copy before that work has read it.
TEST(BatchStagerGPU, SlotReuseWaitsForTheReadersOfTheLastBatch) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  BatchStager stager(kGpu);
  const Shape shape{64, 3, 32, 32};
  std::vector<int64_t> labels_a(64), labels_b(64);
  for (int i = 0; i < 64; ++i) labels_a[i] = i, labels_b[i] = 1000 + i;
  const Tensor a = RandomTensor(shape, 11, -1, 1, DType::kF32);
  const Tensor b = RandomTensor(shape, 12, 2, 3, DType::kF32);
  // Milliseconds of compute-stream work ahead of the read of batch a.
  Tensor busy = Tensor::Zeros(Shape{int64_t{1} << 27}, DType::kF32, kGpu);
  Tensor seen = Tensor::Empty(shape, DType::kF32, kGpu);

  auto sa = stager.Stage(a, labels_a.data());
  sa->WaitForCopy();
  for (int i = 0; i < 40; ++i) cuda::Scale(busy, 1.0f);
  cuda::Cast(sa->inputs(), seen);  // same dtype: a copy on the compute stream
  Tensor seen_labels = Tensor::Empty(Shape{64}, DType::kI64, kGpu);
  CopyBytes(kGpu, seen_labels.raw_data(), kGpu, sa->labels(), 64 * sizeof(int64_t));
  sa->Release();
  auto sb = stager.Stage(b, labels_b.data());  // reuses the slot of a
  EXPECT_EQ(stager.slots(), 1) << "a released slot was not reused";
  sb->WaitForCopy();

  const Tensor got_a = seen.To(Device::Cpu());
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (got_a.At(i) != a.At(i)) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << bad << " of " << a.numel() << " values of batch a were not a's when the "
                    << "compute stream read them (first at " << first
                    << "): the next batch's copy did not wait for the slot's release";
  std::vector<int64_t> la(64);
  CopyBytes(Device::Cpu(), la.data(), kGpu, seen_labels.raw_data(), 64 * sizeof(int64_t));
  EXPECT_EQ(la, labels_a);

  const Tensor got_b = sb->inputs().To(Device::Cpu());
  std::vector<int64_t> lb(64);
  CopyBytes(Device::Cpu(), lb.data(), kGpu, sb->labels(), 64 * sizeof(int64_t));
  EXPECT_EQ(lb, labels_b);
  for (int64_t i = 0; i < b.numel(); ++i) ASSERT_EQ(got_b.At(i), b.At(i)) << "batch b element " << i;

  // Two in flight: a second slot; then a larger batch grows a slot.
  auto sc = stager.Stage(a.Slice(0, 10), labels_a.data());
  EXPECT_EQ(stager.slots(), 2);
  sb->Release();
  sc->Release();
  const Tensor big = RandomTensor(Shape{200, 3, 32, 32}, 13, -5, 5, DType::kF32);
  std::vector<int64_t> labels_big(200, 7);
  auto sd = stager.Stage(big, labels_big.data());
  sd->WaitForCopy();
  const Tensor got_d = sd->inputs().To(Device::Cpu());
  ASSERT_EQ(got_d.shape(), big.shape());
  for (int64_t i = 0; i < big.numel(); ++i) ASSERT_EQ(got_d.At(i), big.At(i)) << "grown slot, element " << i;
  sd->Release();
}

// Waits until the compute stream of t's GPU has done all issued work (a copy
// to the host runs on it, after that work, and is waited for).
void WaitForGpu(const Tensor& t) { (void)t.Slice(0, 1).To(Device::Cpu()); }

// The gap between EndOfWork and StartOfWork on an idle GPU is measured; a
// gap the GPU spent busy is not.
TEST(IdleMeterGPU, MeasuresHostGapsNotBusyTime) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  cuda::IdleMeter meter(kGpu);
  Tensor t = Tensor::Zeros(Shape{1 << 20}, DType::kF32, kGpu);
  cuda::Scale(t, 2.0f);
  meter.EndOfWork();
  WaitForGpu(t);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  meter.StartOfWork();
  cuda::Scale(t, 2.0f);
  meter.EndOfWork();
  WaitForGpu(t);
  const double idle = meter.idle_seconds();
  EXPECT_GE(idle, 0.09) << "a 100 ms host gap";
  EXPECT_LT(idle, 1.0) << "a 100 ms host gap";
  // Busy: the next step is issued while the GPU still works on this one.
  meter.Reset();
  Tensor busy = Tensor::Zeros(Shape{int64_t{1} << 27}, DType::kF32, kGpu);
  for (int i = 0; i < 40; ++i) cuda::Scale(busy, 1.0f);
  meter.EndOfWork();
  meter.StartOfWork();
  cuda::Scale(t, 2.0f);
  meter.EndOfWork();
  WaitForGpu(t);
  EXPECT_LT(meter.idle_seconds(), 0.005) << "the GPU was busy through the gap";
}

#if CNNFLOW_WITH_CUDA
// cuBLAS is loaded at run time (no GPU needed for that): every function the
// linear layer and the contexts use resolves, and the version is 12 or 13.
TEST(CublasApi, LoadsACublasWithEveryFunctionWeCall) {
  const detail::CublasApi& api = detail::Cublas();
  EXPECT_NE(api.library.find("libcublas.so"), std::string::npos) << api.library;
  EXPECT_NE(api.Create, nullptr);
  EXPECT_NE(api.Destroy, nullptr);
  EXPECT_NE(api.SetStream, nullptr);
  EXPECT_NE(api.SetMathMode, nullptr);
  EXPECT_NE(api.Sgemm, nullptr);
  EXPECT_NE(api.GemmEx, nullptr);
  int major = 0;
  ASSERT_EQ(api.GetProperty(MAJOR_VERSION, &major), CUBLAS_STATUS_SUCCESS);
  EXPECT_TRUE(major == 12 || major == 13) << major;
}
#endif

}  // namespace
}  // namespace cnnflow
