// GPU lanes (ops/device.h) and the collectives of replicas that share one
// GPU (ops/cuda/lane_group.h): the lane scope on the host (any build), then
// on a GPU each lane's own stream and pool, the all-reduce against the
// reduction tree's sum computed here, the broadcast, and a member that
// never arrives or calls another collective. The GPU tests skip without one.
#include "ops/cuda/lane_group.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ops/collectives/collective.h"
#include "ops/device.h"
#include "ops/tensor.h"
#include "tests/ops/cuda/util.h"
#include "tests/ops/gpu_check.h"

#if defined(CNNFLOW_WITH_CUDA)
#include "ops/cuda/context.h"
#endif

namespace cnnflow::testing {
namespace {

TEST(GpuLane, ScopesNestPerThread) {
  EXPECT_EQ(CurrentGpuLane(), 0);
  {
    const GpuLaneScope outer(2);
    EXPECT_EQ(CurrentGpuLane(), 2);
    {
      const GpuLaneScope inner(1);
      EXPECT_EQ(CurrentGpuLane(), 1);
      int other = -1;
      std::thread([&] { other = CurrentGpuLane(); }).join();
      EXPECT_EQ(other, 0) << "a lane is the thread's own";
    }
    EXPECT_EQ(CurrentGpuLane(), 2);
  }
  EXPECT_EQ(CurrentGpuLane(), 0);
  EXPECT_THROW(GpuLaneScope(-1), Error);
}

// Runs fn(lane) on one thread per lane, each in its GpuLaneScope.
template <typename Fn>
void OnLanes(int lanes, Fn fn) {
  std::vector<std::thread> threads;
  for (int l = 0; l < lanes; ++l) {
    threads.emplace_back([&fn, l] {
      const GpuLaneScope scope(l);
      fn(l);
    });
  }
  for (auto& t : threads) t.join();
}

#if defined(CNNFLOW_WITH_CUDA)
TEST(GpuLaneGPU, EachLaneHasItsOwnStreamAndPool) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  cudaStream_t s0 = nullptr, s1 = nullptr;
  MemoryPool* p0 = nullptr;
  MemoryPool* p1 = nullptr;
  {
    const GpuLaneScope lane(0);
    s0 = CudaContext::For(kGpu).stream();
    p0 = &PoolFor(kGpu);
  }
  {
    const GpuLaneScope lane(1);
    s1 = CudaContext::For(kGpu).stream();
    p1 = &PoolFor(kGpu);
    EXPECT_EQ(CudaContext::For(kGpu).lane(), 1);
  }
  EXPECT_NE(s0, s1);
  EXPECT_NE(p0, p1);
  // A block goes back to the pool it came from, whatever the lane then.
  Tensor t;
  {
    const GpuLaneScope lane(1);
    t = Tensor::Zeros(Shape{1024}, DType::kF32, kGpu);
  }
  const size_t before = p1->bytes_in_use();
  t = Tensor();
  EXPECT_LT(p1->bytes_in_use(), before);
}
#endif

// Three lanes' buffers summed by the group: every lane ends with
// ((x0 + x1) + x2) * scale in f32, the reduction tree's order, bit for bit.
TEST(LaneGroupGPU, AllReduceSumsInTheTreeOrderIntoEveryLane) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const int lanes = 3;
  const int64_t n = 100003;  // several blocks, an odd tail
  const float scale = 0.25f;
  std::vector<Tensor> host;
  for (int l = 0; l < lanes; ++l)
    host.push_back(RandomTensor(Shape{n}, 10 + l, -3, 3, DType::kF32));
  auto group = MakeLaneGroup(0, lanes, 30.0);
  std::vector<Tensor> got(lanes);
  OnLanes(lanes, [&](int l) {
    Tensor d = host[l].To(kGpu);
    group->AllReduceSum(l, d.data<float>(), n, "bucket 0", scale);
    group->Broadcast(l, d.data<float>(), 0, "empty");  // a zero-length call matches too
    group->Wait(l);
    got[l] = d.To(Device::Cpu());
  });
  for (int64_t i = 0; i < n; ++i) {
    const float want =
        ((host[0].data<float>()[i] + host[1].data<float>()[i]) + host[2].data<float>()[i]) * scale;
    for (int l = 0; l < lanes; ++l) ASSERT_EQ(got[l].data<float>()[i], want) << l << " " << i;
  }
}

TEST(LaneGroupGPU, BroadcastCopiesLaneZeroAndBarrierMeets) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const int lanes = 2;
  const Tensor a = RandomTensor(Shape{777}, 3, -1, 1, DType::kF32);
  const Tensor b = RandomTensor(Shape{777}, 4, -1, 1, DType::kF32);
  auto group = MakeLaneGroup(0, lanes, 30.0);
  std::vector<Tensor> got(lanes);
  OnLanes(lanes, [&](int l) {
    Tensor d = (l == 0 ? a : b).To(kGpu);
    group->Broadcast(l, d.data<float>(), d.numel(), "running_mean");
    group->Barrier(l, "after");
    group->Wait(l);
    got[l] = d.To(Device::Cpu());
  });
  for (int l = 0; l < lanes; ++l)
    EXPECT_EQ(std::memcmp(got[l].raw_data(), a.raw_data(), a.nbytes()), 0) << l;
}

TEST(LaneGroupGPU, AMissingOrMismatchedMemberFailsEveryone) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  {
    auto group = MakeLaneGroup(0, 2, 0.5);
    const GpuLaneScope lane(0);
    Tensor d = Tensor::Zeros(Shape{8}, DType::kF32, kGpu);
    group->AllReduceSum(0, d.data<float>(), 8, "bucket 3", 1);
    try {
      group->Wait(0);  // lane 1 never comes
      ADD_FAILURE() << "no timeout";
    } catch (const CollectiveTimeout& e) {
      ExpectContains(e.what(), {"bucket 3", "1 of 2"});
    }
    EXPECT_TRUE(group->broken());
  }
  auto group = MakeLaneGroup(0, 2, 30.0);
  std::vector<std::string> errors(2);
  OnLanes(2, [&](int l) {
    Tensor d = Tensor::Zeros(Shape{8}, DType::kF32, kGpu);
    try {
      group->AllReduceSum(l, d.data<float>(), l == 0 ? 8 : 4, "bucket 1", 1);
      group->Wait(l);
    } catch (const CollectiveError& e) {
      errors[l] = e.what();
    }
  });
  EXPECT_TRUE(errors[0].find("differs") != std::string::npos ||
              errors[1].find("differs") != std::string::npos)
      << errors[0] << " | " << errors[1];
  EXPECT_FALSE(errors[0].empty() || errors[1].empty()) << "one member went on";
}

}  // namespace
}  // namespace cnnflow::testing
