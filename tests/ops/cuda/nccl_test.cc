// NCCL collectives of GPU data parallelism (ops/cuda/nccl_comm.h): the host
// arithmetic (global ranks, device checks) on any machine; all-reduce,
// broadcast, stream ordering, abort and the bounded start-up on every GPU
// the machine has (GPU tests skip without one).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "ops/cuda/nccl_comm.h"
#include "tests/ops/gpu_check.h"

#if CNNFLOW_WITH_CUDA
#include <cuda_runtime.h>

#include <chrono>
#include <exception>
#include <future>
#include <memory>
#include <thread>

#include "ops/collectives/collective_mpi.h"
#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "tests/ops/run_threads.h"
#endif

namespace cnnflow {
namespace {

// ---------------------------------------------------------------------------
// Host logic (every build).

TEST(NcclLayout, GlobalRanksCountReplicasOfLowerProcesses) {
  // Processes with 2, 1 and 3 replicas: global ranks 0-1, 2, 3-5.
  const std::vector<uint64_t> counts = {2, 1, 3};
  const int expected_offset[] = {0, 2, 3};
  for (int p = 0; p < 3; ++p) {
    const NcclLayout l = ComputeNcclLayout(counts, p);
    EXPECT_EQ(l.global_size, 6) << "process " << p;
    EXPECT_EQ(l.global_offset, expected_offset[p]) << "process " << p;
  }
}

TEST(NcclLayout, ProcessesTileTheGlobalRanks) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    const int procs = 1 + static_cast<int>(rng() % 6);
    std::vector<uint64_t> counts(procs);
    int total = 0;
    for (auto& c : counts) total += static_cast<int>(c = 1 + rng() % 8);
    std::vector<int> owner(total, -1);
    for (int p = 0; p < procs; ++p) {
      const NcclLayout l = ComputeNcclLayout(counts, p);
      ASSERT_EQ(l.global_size, total);
      for (uint64_t r = 0; r < counts[p]; ++r) {
        ASSERT_LT(l.global_offset + static_cast<int>(r), total);
        ASSERT_EQ(owner[l.global_offset + r], -1)
            << "global rank " << l.global_offset + r << " given to processes "
            << owner[l.global_offset + r] << " and " << p;
        owner[l.global_offset + r] = p;
      }
    }
    for (int g = 0; g < total; ++g) EXPECT_NE(owner[g], -1) << "global rank " << g << " unowned";
  }
}

TEST(NcclLayout, RejectsEmptyProcessesAndBadRanks) {
  try {
    ComputeNcclLayout({2, 0, 1}, 0);
    FAIL() << "a process without replicas was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("process 1 has 0 GPU replicas"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ComputeNcclLayout({1, 1}, 2), Error);
  EXPECT_THROW(ComputeNcclLayout({1, 1}, -1), Error);
}

TEST(NcclDevices, RejectsTheSameGpuTwiceNamingIt) {
  try {
    CheckNcclDevices({0, 1, 2, 1});
    FAIL() << "a repeated GPU was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("replicas 1 and 3"), std::string::npos) << m;
    EXPECT_NE(m.find("cuda:1"), std::string::npos) << m;
  }
  EXPECT_THROW(CheckNcclDevices({}), Error);
  EXPECT_THROW(CheckNcclDevices({0, -1}), Error);
  EXPECT_NO_THROW(CheckNcclDevices({3, 0, 2, 1}));
}

TEST(NcclDevices, DescribesDevicesWithGlobalRanks) {
  EXPECT_EQ(DescribeNcclDevices({2, 5}, 4), "cuda:2 (global rank 4), cuda:5 (global rank 5)");
}

#if CNNFLOW_WITH_CUDA

// Argument checks come before any CUDA call, so they run without a GPU too.
TEST(NcclGroup, RejectsDuplicateDevicesBeforeStarting) {
  EXPECT_THROW(NcclGroup({0, 0}, MpiWorld::Get(), 5.0), Error);
  EXPECT_THROW(NcclGroup({1, 1}, 2, 0, NcclGroup::UniqueId{}, 5.0), Error);
}

TEST(NcclGroup, RejectsReplicasOutsideTheGroup) {
  try {
    NcclGroup g({0, 1}, 2, 1, NcclGroup::UniqueId{}, 5.0);
    FAIL() << "global ranks 1..2 of a group of 2 were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not fit in a group of 2"), std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------
// GPU tests.

std::vector<int> AllGpus() {
  std::vector<int> d(CudaDeviceCount());
  for (int i = 0; i < static_cast<int>(d.size()); ++i) d[i] = i;
  return d;
}

// GPU memory for n floats on `device`.
class DeviceFloats {
 public:
  DeviceFloats(int device, int64_t n) : device_(device), n_(n) {
    cudaSetDevice(device);
    if (n > 0 && cudaMalloc(&p_, n * sizeof(float)) != cudaSuccess) p_ = nullptr;
  }
  ~DeviceFloats() {
    if (p_) {
      cudaSetDevice(device_);
      cudaFree(p_);
    }
  }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* get() const { return static_cast<float*>(p_); }
  void Upload(const std::vector<float>& v) {
    cudaSetDevice(device_);
    if (n_ > 0) {
      ASSERT_EQ(cudaMemcpy(p_, v.data(), n_ * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      // From pageable memory cudaMemcpy may return before the data landed, and
      // the streams under test do not wait for the legacy stream.
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
  }
  std::vector<float> Download() const {
    std::vector<float> v(n_);
    cudaSetDevice(device_);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return v;
  }

 private:
  int device_;
  int64_t n_;
  void* p_ = nullptr;
};

std::vector<float> RandomFloats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// Runs fn(r) for every local replica, each on its own thread (replicas of one
// process must not drive NCCL from one thread), and rethrows the first error.
template <typename Fn>
void OnEveryReplica(int replicas, Fn fn) {
  for (auto& e : testing::RunRanks(replicas, fn)) {
    if (e) std::rethrow_exception(e);
  }
}

// The two ways of making a group over every GPU of the machine: from the
// (single-process) MPI world, which skips NCCL when there is one GPU, and the
// explicit form, which uses NCCL even for one rank.
enum class GroupKind { kWorld, kExplicitNccl };
const char* Name(GroupKind k) {
  return k == GroupKind::kWorld ? "world group" : "explicit NCCL group";
}

std::unique_ptr<NcclGroup> MakeGroup(GroupKind kind, double timeout_s = 60.0) {
  const std::vector<int> gpus = AllGpus();
  if (kind == GroupKind::kWorld)
    return std::make_unique<NcclGroup>(gpus, MpiWorld::Get(), timeout_s);
  return std::make_unique<NcclGroup>(gpus, static_cast<int>(gpus.size()), 0,
                                     NcclGroup::NewUniqueId(), timeout_s);
}

void CheckAllReduce(GroupKind kind, float scale) {
  auto group = MakeGroup(kind);
  const int n = group->size();
  ASSERT_EQ(group->global_size(), n);
  ASSERT_EQ(group->global_offset(), 0);
  // The world group skips NCCL only when the job has one replica.
  ASSERT_EQ(group->uses_nccl(), kind == GroupKind::kExplicitNccl || n > 1);
  // Several sizes in flight at once, odd ones and an empty one among them.
  const std::vector<int64_t> sizes = {1, 7, 1000, 0, 65537, 1 << 20};
  std::vector<std::vector<std::vector<float>>> host(n);  // [replica][buffer]
  std::vector<std::vector<std::unique_ptr<DeviceFloats>>> dev(n);
  for (int r = 0; r < n; ++r) {
    for (size_t b = 0; b < sizes.size(); ++b) {
      host[r].push_back(RandomFloats(sizes[b], 1000 * r + b));
      dev[r].push_back(std::make_unique<DeviceFloats>(group->device(r), sizes[b]));
      if (sizes[b] > 0) {
        ASSERT_NE(dev[r][b]->get(), nullptr) << "cudaMalloc failed";
      }
      dev[r][b]->Upload(host[r][b]);
    }
  }
  OnEveryReplica(n, [&](int r) {
    for (size_t b = 0; b < sizes.size(); ++b) {
      group->AllReduceSum(r, dev[r][b]->get(), sizes[b], "bucket " + std::to_string(b), scale);
    }
    group->Wait(r);
  });
  for (size_t b = 0; b < sizes.size(); ++b) {
    std::vector<double> want(sizes[b], 0.0);
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < sizes[b]; ++i) want[i] += host[r][b][i];
    }
    for (int r = 0; r < n; ++r) {
      const std::vector<float> got = dev[r][b]->Download();
      double worst = 0;
      int64_t worst_i = -1;
      for (int64_t i = 0; i < sizes[b]; ++i) {
        const double err = std::abs(got[i] - scale * want[i]);
        if (err > worst) {
          worst = err;
          worst_i = i;
        }
      }
      // Float sums of n values in [-1, 1]: rounding stays far below this.
      EXPECT_LE(worst, 1e-5 * n * std::max(1.0f, std::abs(scale)))
          << Name(kind) << ", " << n << " GPUs, scale " << scale << ": buffer of " << sizes[b]
          << " floats on replica " << r << ": element " << worst_i << " is "
          << (worst_i >= 0 ? got[worst_i] : 0) << ", the CPU sum x scale is "
          << (worst_i >= 0 ? scale * want[worst_i] : 0);
    }
  }
}

TEST(NcclGPU, AllReduceSumMatchesCpuSumOverEveryGpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckAllReduce(GroupKind::kWorld, 1.0f);
  CheckAllReduce(GroupKind::kExplicitNccl, 1.0f);
}

TEST(NcclGPU, AllReduceSumAppliesTheScale) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckAllReduce(GroupKind::kWorld, 0.25f);
  CheckAllReduce(GroupKind::kExplicitNccl, 0.25f);
}

void CheckBroadcast(GroupKind kind) {
  auto group = MakeGroup(kind);
  const int n = group->size();
  const int64_t count = 4099;
  std::vector<std::vector<float>> host(n);
  std::vector<std::unique_ptr<DeviceFloats>> dev(n);
  for (int root : {n - 1, 0}) {
    for (int r = 0; r < n; ++r) {
      host[r] = RandomFloats(count, 77 + r + 10 * root);
      dev[r] = std::make_unique<DeviceFloats>(group->device(r), count);
      ASSERT_NE(dev[r]->get(), nullptr);
      dev[r]->Upload(host[r]);
    }
    OnEveryReplica(n, [&](int r) {
      group->Broadcast(r, dev[r]->get(), count, root, "initial parameters");
      group->Broadcast(r, dev[r]->get(), 0, root, "empty");
      group->Wait(r);
    });
    for (int r = 0; r < n; ++r) {
      const std::vector<float> got = dev[r]->Download();
      int64_t mismatches = 0, first = -1;
      for (int64_t i = 0; i < count; ++i) {
        if (got[i] != host[root][i]) {
          if (first < 0) first = i;
          ++mismatches;
        }
      }
      EXPECT_EQ(mismatches, 0) << Name(kind) << ": replica " << r << " differs from root " << root
                               << " in " << mismatches << " of " << count << " values, first at "
                               << first;
    }
  }
  try {
    group->Broadcast(0, dev[0]->get(), count, n, "bad root");
    FAIL() << "root " << n << " of a group of " << n << " was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("root " + std::to_string(n)), std::string::npos)
        << e.what();
  }
}

TEST(NcclGPU, BroadcastCopiesTheRootsValues) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckBroadcast(GroupKind::kWorld);
  CheckBroadcast(GroupKind::kExplicitNccl);
}

// A buffer written on the compute stream just before AllReduceSum (behind a
// long queue of work) is reduced with its new values, and work issued on the
// compute stream after Wait sees the result. The scale makes the collective
// change the data even with one GPU.
void CheckOrdering(GroupKind kind) {
  auto group = MakeGroup(kind);
  const int n = group->size();
  const int64_t count = 1 << 18;
  const float scale = 3.0f;
  const size_t busy_bytes = size_t{1} << 29;
  std::vector<std::unique_ptr<DeviceFloats>> data(n), fresh(n), busy(n);
  std::vector<std::vector<float>> fresh_host(n);
  for (int r = 0; r < n; ++r) {
    data[r] = std::make_unique<DeviceFloats>(group->device(r), count);
    fresh[r] = std::make_unique<DeviceFloats>(group->device(r), count);
    busy[r] = std::make_unique<DeviceFloats>(group->device(r), busy_bytes / sizeof(float));
    ASSERT_TRUE(data[r]->get() && fresh[r]->get() && busy[r]->get()) << "cudaMalloc failed";
    data[r]->Upload(std::vector<float>(count, 0.0f));
    fresh_host[r] = RandomFloats(count, 500 + r);
    fresh[r]->Upload(fresh_host[r]);
  }
  std::vector<std::vector<float>> seen(n, std::vector<float>(count));
  OnEveryReplica(n, [&](int r) {
    CudaContext& ctx = CudaContext::Get(group->device(r));
    ctx.Activate();
    // Milliseconds of work queued ahead of the write.
    for (int k = 0; k < 16; ++k) {
      CNNFLOW_CUDA_CHECK(cudaMemsetAsync(busy[r]->get(), k, busy_bytes, ctx.stream()));
    }
    CNNFLOW_CUDA_CHECK(cudaMemcpyAsync(data[r]->get(), fresh[r]->get(), count * sizeof(float),
                                       cudaMemcpyDeviceToDevice, ctx.stream()));
    group->AllReduceSum(r, data[r]->get(), count, "fresh gradients", scale);
    group->Wait(r);
    CNNFLOW_CUDA_CHECK(cudaMemcpyAsync(seen[r].data(), data[r]->get(), count * sizeof(float),
                                       cudaMemcpyDeviceToHost, ctx.stream()));
    ctx.Synchronize();
  });
  std::vector<double> want(count, 0.0);
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < count; ++i) want[i] += fresh_host[r][i];
  }
  for (int r = 0; r < n; ++r) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < count; ++i) {
      if (std::abs(seen[r][i] - scale * want[i]) > 1e-5 * n * scale) {
        if (first < 0) first = i;
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0) << Name(kind) << ": replica " << r << ": " << bad << " of " << count
                      << " values are not 3 x the sum of the values written just before the "
                      << "all-reduce (first at " << first << ": "
                      << (first >= 0 ? seen[r][first] : 0) << ", want "
                      << (first >= 0 ? scale * want[first] : 0)
                      << "): the collective was not ordered after the compute stream, or the "
                      << "compute stream not after the collective";
  }
}

TEST(NcclGPU, CollectivesAreOrderedWithTheComputeStream) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckOrdering(GroupKind::kWorld);
  CheckOrdering(GroupKind::kExplicitNccl);
}

void CheckAbort(GroupKind kind) {
  auto group = MakeGroup(kind);
  const int n = group->size();
  std::vector<std::unique_ptr<DeviceFloats>> dev(n);
  for (int r = 0; r < n; ++r) {
    dev[r] = std::make_unique<DeviceFloats>(group->device(r), 1024);
    dev[r]->Upload(std::vector<float>(1024, 1.0f));
  }
  OnEveryReplica(n, [&](int r) { group->AllReduceSum(r, dev[r]->get(), 1024, "bucket 0", 0.5f); });
  group->Abort("replica 1 failed: out of memory in conv2 backward");
  EXPECT_TRUE(group->broken());
  for (int r = 0; r < n; ++r) {
    try {
      group->Wait(r);
      ADD_FAILURE() << Name(kind) << ": Wait(" << r << ") returned after Abort";
    } catch (const CollectiveAborted& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("out of memory in conv2 backward"), std::string::npos) << m;
      EXPECT_NE(m.find("replica " + std::to_string(r)), std::string::npos) << m;
      EXPECT_NE(m.find("cuda:" + std::to_string(group->device(r))), std::string::npos) << m;
    }
    EXPECT_THROW(group->AllReduceSum(r, dev[r]->get(), 1024, "bucket 1"), CollectiveAborted);
    EXPECT_THROW(group->Broadcast(r, dev[r]->get(), 1024, 0, "bn buffers"), CollectiveAborted);
  }
  // The group goes away cleanly once broken (its communicators are aborted).
  group.reset();
}

TEST(NcclGPU, AbortMakesWaitAndLaterCallsThrow) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  CheckAbort(GroupKind::kWorld);
  CheckAbort(GroupKind::kExplicitNccl);
}

// A group that counts one more replica than ever joins (a process that never
// started) fails start-up within its timeout, naming this process's GPUs,
// instead of hanging.
TEST(NcclGPU, MissingPeerFailsStartUpWithinTheTimeout) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const std::vector<int> gpus = AllGpus();
  const double timeout_s = 3.0;
  const auto id = NcclGroup::NewUniqueId();
  // In a thread, so that a hang in NCCL's abort is reported, not waited for.
  auto result = std::make_shared<std::promise<std::string>>();
  std::future<std::string> done = result->get_future();
  const auto start = std::chrono::steady_clock::now();
  std::thread([gpus, id, timeout_s, result] {
    try {
      NcclGroup g(gpus, static_cast<int>(gpus.size()) + 1, 0, id, timeout_s);
      result->set_value("no error: the group started without its last replica");
    } catch (const CollectiveTimeout& e) {
      result->set_value(std::string("timeout: ") + e.what());
    } catch (const std::exception& e) {
      result->set_value(std::string("other error: ") + e.what());
    }
  }).detach();
  ASSERT_EQ(done.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "NCCL start-up with a missing peer did not end within 60 s (timeout " << timeout_s
      << " s)";
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string m = done.get();
  EXPECT_EQ(m.rfind("timeout: ", 0), 0u) << m;
  EXPECT_NE(m.find("cuda:0 (global rank 0)"), std::string::npos) << m;
  EXPECT_NE(m.find("did not complete within 3 s"), std::string::npos) << m;
  EXPECT_GE(took, timeout_s * 0.9) << m;
  EXPECT_LT(took, timeout_s + 30) << m;
}

#endif  // CNNFLOW_WITH_CUDA

}  // namespace
}  // namespace cnnflow
