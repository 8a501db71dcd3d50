// The CUDA runtime pieces: batch staging to a GPU, the idle meter, and the
// cuBLAS loaded at run time. GPU tests skip without a GPU.
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
#include "ops/train/optimizer.h"
#include "tests/ops/cuda/util.h"
#include "tests/ops/gpu_check.h"
#include "tests/ops/gradient_check.h"

#if CNNFLOW_WITH_CUDA
#include "ops/cuda/cublas_api.h"
#endif

namespace cnnflow {
namespace {

using namespace ::cnnflow::testing;  // tests/ops/cuda/util.h, gpu_check.h

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
  for (int64_t i = 0; i < b.numel(); ++i)
    ASSERT_EQ(got_b.At(i), b.At(i)) << "batch b element " << i;

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
  for (int64_t i = 0; i < big.numel(); ++i)
    ASSERT_EQ(got_d.At(i), big.At(i)) << "grown slot, element " << i;
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
