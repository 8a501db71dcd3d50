// What crosses GPU lanes (ops/device.h) for pipelines and tensor
// parallelism: a StreamEvent that another lane's stream waits for
// (ops/stream_event.h), the strided copies the tensor-parallel shards make
// on the device (ops/cuda/strided_copy.h) against the host loop, and a
// lanes' group whose members are lanes 2 and 3 (first_lane). On the host:
// a CPU event does nothing and has passed. The GPU tests skip without one.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "ops/cuda/lane_group.h"
#include "ops/cuda/strided_copy.h"
#include "ops/device.h"
#include "ops/device_ops.h"
#include "ops/stream_event.h"
#include "ops/tensor.h"
#include "tests/ops/cuda/util.h"
#include "tests/ops/gpu_check.h"

namespace cnnflow::testing {
namespace {

TEST(StreamEvent, OnTheCpuItHasPassedAndWaitsForNothing) {
  const StreamEvent e(Device::Cpu());
  EXPECT_TRUE(e.passed());
  e.Await(Device::Cpu());
}

// Lane 0 writes a buffer with a long run of kernels; lane 1 waits for the
// event recorded after them, then copies the buffer into its own lane: it
// sees the last value, and the event has passed once lane 1's copy is read.
TEST(StreamEventGPU, AnotherLaneWaitsForTheRecordedWork) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const int64_t n = 1 << 22;
  Tensor buffer;
  std::unique_ptr<StreamEvent> written;
  {
    const GpuLaneScope lane(0);
    buffer = Tensor::Zeros(Shape{n}, DType::kF32, kGpu);
    const Tensor one = Tensor::Full(Shape{n}, 1.0).To(kGpu);
    for (int k = 0; k < 50; ++k) AddInPlace(buffer, one);
    written = std::make_unique<StreamEvent>(kGpu);
  }
  Tensor seen;
  std::thread([&] {
    const GpuLaneScope lane(1);
    written->Await(kGpu);
    seen = buffer.To(kGpu).To(Device::Cpu());
  }).join();
  EXPECT_TRUE(written->passed());
  for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(seen.data<float>()[i], 50.0f) << i;
}

// Runs of a [5, 7] block cut out of a [5, 12] matrix at column 3, put back
// and added (times 0.5) into another, as the host loop does it.
TEST(StridedCopyGPU, CopiesAndAddsRunsAsTheHostLoop) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const int64_t rows = 5, cols = 12, begin = 3, width = 7;
  const Tensor full = RandomTensor(Shape{rows, cols}, 1, -1, 1, DType::kF32);
  const Tensor base = RandomTensor(Shape{rows, cols}, 2, -1, 1, DType::kF32);
  const Tensor full_d = full.To(kGpu);
  Tensor part_d = Tensor::Zeros(Shape{rows, width}, DType::kF32, kGpu);
  Tensor into_d = base.To(kGpu);
  cuda::StridedCopy(kGpu, part_d.data<float>(), width, full_d.data<float>() + begin, cols, width,
                    rows, 1.0f, false);
  cuda::StridedCopy(kGpu, into_d.data<float>() + begin, cols, part_d.data<float>(), width, width,
                    rows, 0.5f, true);
  const Tensor part = part_d.To(Device::Cpu()), into = into_d.To(Device::Cpu());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const float f = full.data<float>()[i * cols + j], b = base.data<float>()[i * cols + j];
      const bool inside = j >= begin && j < begin + width;
      if (inside) ASSERT_EQ(part.data<float>()[i * width + j - begin], f) << i << " " << j;
      ASSERT_NEAR(into.data<float>()[i * cols + j], inside ? b + 0.5f * f : b, 1e-6)
          << i << " " << j;
    }
  }
}

// A tensor-parallel group of lanes 2 and 3 (DP x TP on one GPU): members 0
// and 1 call from those lanes and sum; a call from another lane is refused,
// naming the lane it should come from.
TEST(LaneGroupGPU, AGroupOfLanesTwoAndThreeSumsFromThoseLanes) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  auto group = MakeLaneGroup(0, 2, 30.0, /*first_lane=*/2);
  std::vector<float> got(2);
  std::vector<std::thread> threads;
  for (int m = 0; m < 2; ++m) {
    threads.emplace_back([&, m] {
      const GpuLaneScope lane(2 + m);
      Tensor d = Tensor::Full(Shape{3}, m + 1.0).To(kGpu);
      group->AllReduceSum(m, d.data<float>(), 3, "tp", 1.0f);
      group->Wait(m);
      got[m] = d.To(Device::Cpu()).data<float>()[2];
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(got[0], 3.0f);
  EXPECT_EQ(got[1], 3.0f);
  auto other = MakeLaneGroup(0, 2, 1.0, /*first_lane=*/2);
  Tensor d = Tensor::Zeros(Shape{3}, DType::kF32, kGpu);
  try {
    other->AllReduceSum(0, d.data<float>(), 3, "tp", 1.0f);  // from lane 0
    ADD_FAILURE() << "a call from lane 0 was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not its own (2)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cnnflow::testing
