// Softmax cross-entropy on a GPU against the CPU's: f32 and half logits,
// bad labels, and the asynchronous losses in flight on every GPU. GPU tests
// skip without a GPU.
#include "ops/loss.h"

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
#include "ops/train/optimizer.h"
#include "tests/ops/cuda/util.h"
#include "tests/ops/gpu_check.h"
#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

using namespace ::cnnflow::testing;  // tests/ops/cuda/util.h, gpu_check.h

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

// ---------------------------------------------------------------- mixed labels (mixup, cutmix)

// A batch's mixed targets as mixup makes them (row i with row N-1-i), with
// the edge weights (1: the label alone, 0: the other alone, 0.5: a tie that
// counts the label) and random ones between.
struct HostMix {
  HostMix(const std::vector<int64_t>& labels, uint64_t seed) {
    const size_t n = labels.size();
    const Tensor w = RandomTensor(Shape{static_cast<int64_t>(n)}, seed, 0, 1, DType::kF32);
    for (size_t i = 0; i < n; ++i) {
      other.push_back(labels[n - 1 - i]);
      weight.push_back(static_cast<float>(w.At(static_cast<int64_t>(i))));
    }
    const float edges[] = {1.0f, 0.0f, 0.5f, 0.25f};
    for (size_t i = 0; i < std::min<size_t>(n, 4); ++i) weight[i] = edges[i];
  }
  LabelMix host() const { return {other.data(), weight.data()}; }
  std::vector<int64_t> other;
  std::vector<float> weight;
};

// The same mix in GPU memory.
struct DeviceMixOf {
  explicit DeviceMixOf(const HostMix& m) : other(m.other), weight(UploadF32(m.weight)) {}
  LabelMix get() const { return {other.get(), weight.data<float>()}; }
  DeviceLabels other;
  Tensor weight;
};

void ExpectMixedLossMatches(int64_t n, int64_t k, double grad_scale, double smoothing,
                            uint64_t seed) {
  SCOPED_TRACE(StrCat("N ", n, " K ", k, " grad_scale ", grad_scale, " smoothing ", smoothing));
  const Tensor logits = RandomTensor(Shape{n, k}, seed, -4, 4, DType::kF32);
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = (i * 7 + 1) % k;
  const HostMix mix(labels, seed + 100);
  const LabelMix hm = mix.host();
  Tensor d_cpu = Tensor::Empty(logits.shape());
  const LossResult cpu =
      SoftmaxCrossEntropy(logits, labels.data(), &d_cpu, grad_scale, smoothing, &hm);
  // Without the mix the loss differs: the test would see the mix ignored.
  const LossResult hard =
      SoftmaxCrossEntropy(logits, labels.data(), nullptr, grad_scale, smoothing);
  EXPECT_GT(std::abs(hard.loss - cpu.loss), 1e-3) << "the mix does not change the loss";
  const Tensor lg = logits.To(kGpu);
  Tensor d_gpu = Tensor::Empty(logits.shape(), DType::kF32, kGpu);
  const DeviceLabels dl(labels);
  const DeviceMixOf dm(mix);
  const LabelMix gm = dm.get();
  const LossResult gpu =
      cuda::SoftmaxCrossEntropy(lg, dl.get(), &d_gpu, grad_scale, smoothing, &gm);
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-5 * std::max(1.0, std::abs(cpu.loss))) << "loss";
  EXPECT_EQ(gpu.correct, cpu.correct) << "correct count";
  EXPECT_LE(NormalisedError(d_cpu, d_gpu), 1e-5) << "dlogits";
  const Tensor got = d_gpu.To(Device::Cpu());
  double worst = 0;
  for (int64_t i = 0; i < got.numel(); ++i)
    worst = std::max(worst, std::abs(got.At(i) - d_cpu.At(i)));
  EXPECT_LE(worst, 1e-5) << "dlogits, the largest difference";
}

TEST(SoftmaxCrossEntropyGPU, MixedLabelsMatchCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  ExpectMixedLossMatches(37, 10, -1, 0.0, 21);
  ExpectMixedLossMatches(37, 10, 0.5, 0.1, 22);  // label smoothing combined with the mix
  ExpectMixedLossMatches(1000, 100, -1, 0.0, 23);
  ExpectMixedLossMatches(257, 1001, 1.0 / 512, 0.3, 24);
}

// The error of the GPU loss on `mix` (uploaded), or "" when there is none.
std::string MixError(const Tensor& logits, const DeviceLabels& labels, const HostMix& mix) {
  const DeviceMixOf dm(mix);
  const LabelMix gm = dm.get();
  try {
    cuda::SoftmaxCrossEntropy(logits, labels.get(), nullptr, -1, 0.0, &gm);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SoftmaxCrossEntropyGPU, BadMixNamesRowAndValues) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const Tensor logits = RandomTensor(Shape{12, 11}, 9, -1, 1, DType::kF32).To(kGpu);
  std::vector<int64_t> labels(12, 1);
  const DeviceLabels dl(labels);
  HostMix mix(labels, 3);
  mix.other[6] = 11;  // == K
  std::string e = MixError(logits, dl, mix);
  EXPECT_NE(e.find("mixed label 11 with weight"), std::string::npos) << "[" << e << "]";
  EXPECT_NE(e.find("at index 6"), std::string::npos) << e;
  mix.other[6] = 2;
  mix.weight[4] = 1.5f;
  e = MixError(logits, dl, mix);
  EXPECT_NE(e.find("with weight 1.5 at index 4"), std::string::npos) << "[" << e << "]";
  // A mix left in pageable host memory is refused, not read by the kernel.
  mix.weight[4] = 0.5f;
  const LabelMix host = mix.host();
  EXPECT_THROW(cuda::SoftmaxCrossEntropy(logits, dl.get(), nullptr, -1, 0.0, &host), Error);
}

// The mix staged with the rows and labels (ops/cuda/batch_stager.h), as the
// forward_backward stage stages it, reaches the loss intact.
TEST(SoftmaxCrossEntropyGPU, StagedMixMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const int64_t n = 64, k = 10;
  BatchStager stager(kGpu);
  const Tensor logits = RandomTensor(Shape{n, k}, 31, -3, 3, DType::kF32);
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = (i * 3) % k;
  const HostMix mix(labels, 32);
  const LabelMix hm = mix.host();
  auto staged = stager.Stage(logits, labels.data(), &hm);  // the logits as the staged rows
  ASSERT_NE(staged->mix(), nullptr);
  staged->WaitForCopy();
  Tensor d_gpu = Tensor::Empty(logits.shape(), DType::kF32, kGpu);
  const LossResult gpu =
      cuda::SoftmaxCrossEntropy(staged->inputs(), staged->labels(), &d_gpu, -1, 0.1, staged->mix());
  staged->Release();
  Tensor d_cpu = Tensor::Empty(logits.shape());
  const LossResult cpu = SoftmaxCrossEntropy(logits, labels.data(), &d_cpu, -1, 0.1, &hm);
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-5 * std::max(1.0, std::abs(cpu.loss)));
  EXPECT_EQ(gpu.correct, cpu.correct);
  EXPECT_LE(NormalisedError(d_cpu, d_gpu), 1e-5);
  // Without a mix nothing is staged for it.
  auto plain = stager.Stage(logits, labels.data());
  EXPECT_EQ(plain->mix(), nullptr);
}

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
      pending.push_back(
          cuda::SoftmaxCrossEntropyAsync(logits.To(Device::Cuda(d)), dl[d]->get(), nullptr));
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

}  // namespace
}  // namespace cnnflow
