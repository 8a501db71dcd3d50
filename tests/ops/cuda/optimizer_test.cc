// The fused SGD / Adam / AdamW steps on a GPU against the CPU's
// optimizers and the formulas. GPU tests skip without a GPU.
#include "ops/train/optimizer.h"

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

#include "ops/cuda/batch_stager.h"
#include "ops/cuda/kernels.h"
#include "ops/layers/dropout.h"
#include "ops/loss.h"
#include "ops/train/adam.h"
#include "ops/train/sgd.h"
#include "tests/ops/cuda/util.h"
#include "tests/ops/gpu_check.h"
#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

using namespace ::cnnflow::testing;  // tests/ops/cuda/util.h, gpu_check.h

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

// Parameter groups split a fused launch: each group's launch has its own
// lr and weight decay.
TEST(OptimizerGPU, ParamGroupsMatchCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  std::vector<ParamGroup> groups(2);
  groups[0].params = {"p1*"};  // p1, p10..p19, ...
  groups[0].lr_scale = 8;
  groups[0].weight_decay = 0.0;
  groups[1].params = {"p3"};
  groups[1].weight_decay = 0.3;
  for (const char* type : {"sgd", "adam", "adamw"}) {
    SCOPED_TRACE(type);
    Args a;
    a.Set("lr", 0.05);
    a.Set("weight_decay", 0.02);
    if (std::string(type) == "sgd") a.Set("momentum", 0.9);
    ParamSet ps(ParamSizes(/*with_huge=*/false));
    auto on_cpu = MakeOptimizer({type, a, groups}, ps.Named(ps.cpu));
    auto on_gpu = MakeOptimizer({type, a, groups}, ps.Named(ps.gpu));
    ExpectSameSteps(ps, *on_cpu, *on_gpu, 1e-5);
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

// One fused step through the device seam: its scalars uploaded, then the
// kernels that read them.
Tensor FusedScalars() {
  return Tensor::Empty(Shape{static_cast<int64_t>(kFusedStepScalarBytes / sizeof(float))},
                       DType::kF32, kGpu);
}
void SgdStep(const std::vector<ParamSlot>& slots, double lr, double momentum) {
  Tensor scalars = FusedScalars();
  UploadSgdScalars(scalars, lr, momentum, 0.0, false, 0.0);
  LaunchFusedSgdStep(slots, scalars);
}
void AdamStep(const std::vector<ParamSlot>& slots, double lr) {
  Tensor scalars = FusedScalars();
  UploadAdamScalars(scalars, lr, 0.9, 0.999, 1e-8, 0, false, 1);
  LaunchFusedAdamStep(slots, scalars);
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
  SgdStep({s}, 0.1, 0.5);
  EXPECT_FLOAT_EQ(p.To(Device::Cpu()).At(0), 0.85f);
  EXPECT_FLOAT_EQ(buf.To(Device::Cpu()).At(0), 1.5f);
  // first: buf = g = 0.5, p = 0.85 - 0.1 * 0.5 = 0.8.
  s.first = true;
  SgdStep({s}, 0.1, 0.5);
  EXPECT_FLOAT_EQ(p.To(Device::Cpu()).At(0), 0.8f);
  EXPECT_FLOAT_EQ(buf.To(Device::Cpu()).At(0), 0.5f);
  // An empty slot list and zero-size slots are no-ops.
  EXPECT_NO_THROW(SgdStep({}, 0.1, 0));
  ParamSlot empty;
  EXPECT_NO_THROW(AdamStep({empty}, 0.1));
  // Adam's first step moves each element by about lr against its gradient's sign.
  Tensor m = Tensor::Zeros(Shape{1}, DType::kF32, kGpu);
  Tensor v = Tensor::Zeros(Shape{1}, DType::kF32, kGpu);
  s.state0 = m.data<float>();
  s.state1 = v.data<float>();
  AdamStep({s}, 0.01);
  EXPECT_NEAR(p.To(Device::Cpu()).At(0), 0.8 - 0.01, 1e-6);
}

}  // namespace
}  // namespace cnnflow
