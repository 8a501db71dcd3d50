#include "ops/collectives/collective.h"

#define OMPI_SKIP_MPICXX 1
#include <gtest/gtest.h>
#include <mpi.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "ops/collectives/collective_mpi.h"
#include "tests/ops/run_threads.h"
#include "tests/testing/collective_data.h"

namespace cnnflow {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

using testing::RandomData;
using testing::RunRanks;

void ExpectNoErrors(const std::vector<std::exception_ptr>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " threw: " << e.what();
    }
  }
}

std::string Message(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  }
  return "";
}

// The reference: the sum in tree order, then the scale.
std::vector<float> TreeOrderSum(const std::vector<std::vector<float>>& in, float scale) {
  std::vector<float> out = testing::TreeOrderSum(in, 0, in.size());
  if (scale != 1.0f) {
    for (auto& x : out) x *= scale;
  }
  return out;
}

void ExpectBitwiseEqual(const std::vector<float>& got, const std::vector<float>& want,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
        << what << " element " << i << ": " << got[i] << " vs " << want[i];
  }
}

TEST(Collective, AllReduceIsTheTreeOrderSumOnEveryRank) {
  for (int n : {1, 2, 3, 4, 6}) {
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{100003}}) {
      for (bool mean : {false, true}) {
        SCOPED_TRACE(::testing::Message() << n << " ranks, " << count << " floats, mean " << mean);
        std::vector<std::vector<float>> in(n), data(n);
        for (int r = 0; r < n; ++r) in[r] = data[r] = RandomData(count, 1000 * n + 10 * r + count);
        const float scale = mean ? 1.0f / n : 1.0f;
        const std::vector<float> want = TreeOrderSum(in, scale);
        LocalGroup group(n, 10.0);
        // Staggered arrivals, latest first, so arrival order is not rank order.
        ExpectNoErrors(RunRanks(n, [&](int r) {
          std::this_thread::sleep_for(std::chrono::microseconds(300 * (n - r)));
          if (mean) {
            group.AllReduceMean(r, data[r].data(), count, "bucket 0");
          } else {
            group.AllReduceSum(r, data[r].data(), count, "bucket 0");
          }
        }));
        for (int r = 0; r < n; ++r) ExpectBitwiseEqual(data[r], want, StrCat("rank ", r));
      }
    }
  }
}

TEST(Collective, RootStepRunsOnceOnTheSumBeforeScaleAndCopy) {
  // The hook the cross-process all-reduce uses: here it adds a stand-in for
  // the other processes' sum.
  for (int n = 1; n <= 3; ++n) {
    const int64_t count = 4099;
    std::vector<std::vector<float>> in(n), data(n);
    for (int r = 0; r < n; ++r) in[r] = data[r] = RandomData(count, 77 + r);
    const std::vector<float> remote = RandomData(count, 99);
    const float scale = 0.25f;
    std::vector<float> want = TreeOrderSum(in, 1.0f);
    for (int64_t i = 0; i < count; ++i) want[i] = (want[i] + remote[i]) * scale;
    std::atomic<int> steps{0};
    LocalGroup group(n, 10.0);
    ExpectNoErrors(RunRanks(n, [&](int r) {
      LocalGroup::PartialsStep step;
      if (r == 0) {
        step = [&](const std::vector<float*>& partials) {
          ++steps;
          EXPECT_EQ(partials, std::vector<float*>{data[0].data()});
          for (int64_t i = 0; i < count; ++i) data[0][i] += remote[i];
        };
      }
      group.AllReduceSum(r, data[r].data(), count, "bucket 1", scale, step);
    }));
    EXPECT_EQ(steps.load(), 1);
    for (int r = 0; r < n; ++r) ExpectBitwiseEqual(data[r], want, StrCat(n, " ranks, rank ", r));
  }
}

TEST(Collective, ReduceSumWritesOnlyTheRoot) {
  const int n = 3;
  const int64_t count = 1001;
  std::vector<std::vector<float>> in(n), data(n);
  for (int r = 0; r < n; ++r) in[r] = data[r] = RandomData(count, 5 + r);
  LocalGroup group(n, 10.0);
  ExpectNoErrors(RunRanks(n, [&](int r) { group.ReduceSum(r, 2, data[r].data(), count, "bn"); }));
  ExpectBitwiseEqual(data[2], TreeOrderSum(in, 1.0f), "root");
  ExpectBitwiseEqual(data[0], in[0], "rank 0");
  ExpectBitwiseEqual(data[1], in[1], "rank 1");
}

TEST(Collective, BroadcastCopiesTheRootEverywhere) {
  for (int n = 1; n <= 4; ++n) {
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{100003}}) {
      const int root = n - 1;
      std::vector<std::vector<float>> data(n);
      for (int r = 0; r < n; ++r) data[r] = RandomData(count, 31 * n + r);
      const std::vector<float> want = data[root];
      LocalGroup group(n, 10.0);
      ExpectNoErrors(RunRanks(
          n, [&](int r) { group.Broadcast(r, root, data[r].data(), count, "parameters"); }));
      for (int r = 0; r < n; ++r) ExpectBitwiseEqual(data[r], want, StrCat(n, " ranks, rank ", r));
    }
  }
  // Bytes, an odd size, with a root step that fills the root's buffer first
  // (as a cross-process broadcast does).
  const int n = 3;
  std::vector<std::string> data(n, std::string(1001, '.'));
  const std::string want = std::string(1000, 'x') + "!";
  LocalGroup group(n, 10.0);
  ExpectNoErrors(RunRanks(n, [&](int r) {
    std::function<void()> step;
    if (r == 1) step = [&] { data[1] = want; };
    group.BroadcastBytes(r, 1, data[r].data(), 1001, "config", step);
  }));
  for (int r = 0; r < n; ++r) EXPECT_EQ(data[r], want) << "rank " << r;
}

TEST(Collective, BackToBackCollectivesWithRandomDelays) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(::testing::Message() << n << " ranks");
    const int kIters = 300;
    LocalGroup group(n, 20.0);
    std::atomic<int> before_barrier{0};
    std::vector<std::string> failures(n);
    ExpectNoErrors(RunRanks(n, [&](int r) {
      std::mt19937 shared(42);     // the same sequence of collectives on every rank
      std::mt19937 own(1000 + r);  // this rank's timing
      std::vector<float> buf;
      int barriers = 0;
      for (int it = 0; it < kIters && failures[r].empty(); ++it) {
        const int kind = shared() % 3;
        const int64_t count = shared() % 5000;
        const int root = shared() % n;
        if (own() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(own() % 200));
        const std::string tag = StrCat("iteration ", it);
        if (kind == 0) {
          // Small integers: the sum is exact, whatever the order.
          buf.resize(count);
          for (int64_t i = 0; i < count; ++i) buf[i] = static_cast<float>((r + 1) * (i % 97 + it));
          group.AllReduceSum(r, buf.data(), count, tag);
          const float ranks_sum = n * (n + 1) / 2.0f;
          for (int64_t i = 0; i < count; ++i) {
            if (buf[i] != ranks_sum * (i % 97 + it)) {
              failures[r] = StrCat(tag, " element ", i, ": ", buf[i]);
              break;
            }
          }
        } else if (kind == 1) {
          buf.assign(count, static_cast<float>(r == root ? it : -1));
          group.Broadcast(r, root, buf.data(), count, tag);
          for (int64_t i = 0; i < count; ++i) {
            if (buf[i] != it) {
              failures[r] = StrCat(tag, " broadcast element ", i, ": ", buf[i]);
              break;
            }
          }
        } else {
          ++before_barrier;
          group.Barrier(r, tag);
          ++barriers;
          if (before_barrier.load() < barriers * n) {
            failures[r] = StrCat(tag, ": left the barrier before everyone arrived");
          }
        }
      }
    }));
    for (int r = 0; r < n; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
    for (int r = 0; r < n; ++r) EXPECT_EQ(group.issued(r), uint64_t{kIters});
  }
}

TEST(Collective, ManyBucketsInFlightFromSeveralThreadsPerRank) {
  // Each rank issues more buckets than there are slots, one thread per
  // bucket; the issue order (not the completion order) is the same on every
  // rank, enforced with issued().
  const int n = 2;
  const int kBuckets = LocalGroup::kMaxInFlight + 4;
  LocalGroup group(n, 20.0);
  std::vector<std::vector<std::vector<float>>> in(n), data(n);
  for (int r = 0; r < n; ++r) {
    for (int b = 0; b < kBuckets; ++b) {
      in[r].push_back(RandomData(100 + 37 * b, 7 * r + b));
      data[r].push_back(in[r].back());
    }
  }
  std::vector<std::exception_ptr> errors(n * kBuckets);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    for (int b = 0; b < kBuckets; ++b) {
      threads.emplace_back([&, r, b] {
        try {
          while (group.issued(r) != static_cast<uint64_t>(b)) std::this_thread::yield();
          group.AllReduceSum(r, data[r][b].data(), data[r][b].size(), StrCat("bucket ", b));
        } catch (...) {
          errors[r * kBuckets + b] = std::current_exception();
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  ExpectNoErrors(errors);
  for (int b = 0; b < kBuckets; ++b) {
    const std::vector<float> want = TreeOrderSum({in[0][b], in[1][b]}, 1.0f);
    for (int r = 0; r < n; ++r) ExpectBitwiseEqual(data[r][b], want, StrCat("bucket ", b));
  }
}

TEST(Collective, MissingRankTimesOutEveryWaiterWithItsName) {
  const int n = 3;
  const double timeout = 0.3;
  LocalGroup group(n, timeout);
  const std::string tag = "bucket 3 (fc1.weight..conv2.bias)";
  std::vector<std::vector<float>> data(n, std::vector<float>(100, 1.0f));
  std::vector<double> elapsed(n);
  const auto errors = RunRanks(n, [&](int r) {
    if (r == 2) return;  // never arrives
    const auto t0 = Clock::now();
    try {
      group.AllReduceSum(r, data[r].data(), 100, tag);
    } catch (...) {
      elapsed[r] = SecondsSince(t0);
      throw;
    }
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " did not throw";
    EXPECT_THROW(std::rethrow_exception(errors[r]), CollectiveTimeout);
    const std::string msg = Message(errors[r]);
    EXPECT_NE(msg.find("rank 2 of 3 did not arrive within 0.3 s"), std::string::npos) << msg;
    EXPECT_NE(msg.find("arrived: ranks 0, 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find(tag), std::string::npos) << msg;
    EXPECT_GE(elapsed[r], 0.2) << "rank " << r;
    EXPECT_LT(elapsed[r], timeout + 2.0) << "rank " << r;
  }
  // The group is broken: the late rank fails at once instead of hanging.
  EXPECT_TRUE(group.broken());
  const auto t0 = Clock::now();
  try {
    group.AllReduceSum(2, data[2].data(), 100, tag);
    ADD_FAILURE() << "a late call on a broken group returned";
  } catch (const CollectiveTimeout& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 of 3 did not arrive"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(SecondsSince(t0), 0.2);
}

TEST(Collective, AbortWakesEveryWaiterWithTheReason) {
  const int n = 3;
  LocalGroup group(n, 30.0);  // far longer than the test may take
  std::vector<std::vector<float>> data(n, std::vector<float>(1000, 1.0f));
  std::vector<double> elapsed(n);
  const auto errors = RunRanks(n, [&](int r) {
    const auto t0 = Clock::now();
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      group.Abort("rank 2 failed in backward: boom");
      return;
    }
    try {
      group.AllReduceSum(r, data[r].data(), 1000, "bucket 7");
    } catch (...) {
      elapsed[r] = SecondsSince(t0);
      throw;
    }
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " did not throw";
    EXPECT_THROW(std::rethrow_exception(errors[r]), CollectiveAborted);
    const std::string msg = Message(errors[r]);
    EXPECT_NE(msg.find("rank 2 failed in backward: boom"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bucket 7"), std::string::npos) << msg;
    EXPECT_LT(elapsed[r], 5.0) << "rank " << r;
  }
  EXPECT_THROW(group.Barrier(0, "after"), CollectiveAborted);
}

TEST(Collective, FailingRootStepFailsEveryRank) {
  const int n = 3;
  LocalGroup group(n, 10.0);
  std::vector<std::vector<float>> data(n, std::vector<float>(64, 1.0f));
  const auto errors = RunRanks(n, [&](int r) {
    LocalGroup::PartialsStep step;
    if (r == 0) step = [](const auto&) { throw Error("MPI_Iallreduce failed: peer gone"); };
    group.AllReduceSum(r, data[r].data(), 64, "bucket 2", 1.0f, step);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r;
    EXPECT_NE(Message(errors[r]).find("peer gone"), std::string::npos) << Message(errors[r]);
  }
  EXPECT_TRUE(group.broken());
}

TEST(Collective, MismatchedCallsFailBothRanks) {
  LocalGroup group(2, 10.0);
  std::vector<float> a(10), b(20);
  const auto errors = RunRanks(2, [&](int r) {
    if (r == 0) {
      group.AllReduceSum(0, a.data(), 10, "bucket 0");
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      group.AllReduceSum(1, b.data(), 20, "bucket 1");
    }
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r;
    EXPECT_THROW(std::rethrow_exception(errors[r]), CollectiveAborted);
    const std::string msg = Message(errors[r]);
    EXPECT_NE(msg.find("'bucket 0' (count 10"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'bucket 1' (count 20"), std::string::npos) << msg;
  }
}

TEST(Collective, BadCallsAreRefusedWithoutBlocking) {
  LocalGroup group(2, 10.0);
  std::vector<float> a(8);
  EXPECT_THROW(group.AllReduceSum(2, a.data(), 8, "x"), Error);
  EXPECT_THROW(group.AllReduceSum(0, a.data(), -1, "x"), Error);
  EXPECT_THROW(group.AllReduceSum(0, nullptr, 8, "x"), Error);
  EXPECT_THROW(group.Broadcast(0, 5, a.data(), 8, "x"), Error);
  EXPECT_FALSE(group.broken());
  EXPECT_THROW(LocalGroup(0), Error);
  EXPECT_THROW(LocalGroup(2, 0.0), Error);

  // Two ranks passing overlapping buffers would race: refused on both.
  LocalGroup shared(2, 10.0);
  std::vector<float> one(100);
  const auto errors =
      RunRanks(2, [&](int r) { shared.AllReduceSum(r, one.data() + r * 10, 50, "bucket 0"); });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r;
    EXPECT_NE(Message(errors[r]).find("overlap"), std::string::npos) << Message(errors[r]);
  }
}

// Sets environment variables for one scope and restores them after.
class ScopedEnv {
 public:
  void Set(const char* name, const char* value) {
    const char* old = getenv(name);
    saved_.push_back({name, old ? std::optional<std::string>(old) : std::nullopt});
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) {
        setenv(it->first.c_str(), it->second->c_str(), 1);
      } else {
        unsetenv(it->first.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(Collective, MpiLaunchDetection) {
  ScopedEnv env;
  for (const char* v : {"CNNFLOW_MPI", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK",
                        "SLURM_STEP_NUM_TASKS"}) {
    env.Set(v, nullptr);
  }
  EXPECT_FALSE(MpiWorld::LaunchedByMpi());
  env.Set("SLURM_NTASKS", "4");  // inside sbatch, but no srun step: a plain process
  EXPECT_FALSE(MpiWorld::LaunchedByMpi());
  env.Set("SLURM_STEP_NUM_TASKS", "4");
  EXPECT_TRUE(MpiWorld::LaunchedByMpi());
  env.Set("SLURM_STEP_NUM_TASKS", "1");
  EXPECT_FALSE(MpiWorld::LaunchedByMpi());
  env.Set("OMPI_COMM_WORLD_SIZE", "2");
  EXPECT_TRUE(MpiWorld::LaunchedByMpi());
  env.Set("CNNFLOW_MPI", "0");
  EXPECT_FALSE(MpiWorld::LaunchedByMpi());
}

TEST(Collective, PlainProcessHasAWorldOfOneWithoutMpiInit) {
  if (MpiWorld::LaunchedByMpi()) GTEST_SKIP() << "started by an MPI launcher";
  MpiWorld& world = MpiWorld::Get();
  EXPECT_FALSE(world.active());
  EXPECT_EQ(world.size(), 1);
  EXPECT_EQ(world.rank(), 0);
  int initialized = 1;
  MPI_Initialized(&initialized);
  EXPECT_EQ(initialized, 0) << "MPI_Init must not run in a plain process";
  std::vector<float> v = {1, 2, 3};
  world.AllReduceSum(v.data(), 3, "bucket 0", 1.0);
  EXPECT_EQ(v, (std::vector<float>{1, 2, 3}));
  EXPECT_NO_THROW(world.AgreeOnHash(42, "graph", 1.0));
  EXPECT_EQ(world.AllGather(7, "x", 1.0), std::vector<uint64_t>{7});

  // The hierarchical all-reduce over a world of one is the local one.
  const int n = 3;
  LocalGroup local(n, 10.0);
  HierarchicalAllReduce hier(local, world, 10.0);
  EXPECT_EQ(hier.global_size(), n);
  std::vector<std::vector<float>> in(n), data(n);
  for (int r = 0; r < n; ++r) in[r] = data[r] = RandomData(999, 3 + r);
  ExpectNoErrors(RunRanks(n, [&](int r) { hier.AllReduceMean(r, data[r].data(), 999, "b"); }));
  for (int r = 0; r < n; ++r) ExpectBitwiseEqual(data[r], TreeOrderSum(in, 1.0f / n), "mean");
}

// What ReplicaSet sees: the replicas' group through the Collective
// interface, whatever it is (here the in-process + MPI one, in a plain
// process), as MakeReplicaCollective makes it.
TEST(Collective, ReplicaCollectiveThroughTheInterface) {
  if (MpiWorld::LaunchedByMpi()) GTEST_SKIP() << "started by an MPI launcher";
  MpiWorld& world = MpiWorld::Get();
  EXPECT_EQ(MakeReplicaCollective({Device::Cpu()}, world, 10.0), nullptr)
      << "one replica in one process has nobody to talk to";
  const int n = 3;
  std::unique_ptr<Collective> group =
      MakeReplicaCollective(std::vector<Device>(n, Device::Cpu()), world, 10.0);
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->size(), n);
  EXPECT_EQ(group->global_size(), n);
  EXPECT_EQ(group->global_offset(), 0);
  EXPECT_FALSE(group->enqueues());
  std::vector<std::vector<float>> in(n), data(n), first(n);
  for (int r = 0; r < n; ++r) in[r] = data[r] = RandomData(300, 7 + r);
  for (int r = 0; r < n; ++r) first[r] = RandomData(5, 20 + r);
  std::atomic<int> arrived{0};
  ExpectNoErrors(RunRanks(n, [&](int r) {
    group->AllReduceSum(r, data[r].data(), 300, "bucket 0", 0.5f);
    group->Broadcast(r, first[r].data(), 5, "initial w");
    if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ++arrived;
    group->Barrier(r, "barrier");
    EXPECT_EQ(arrived.load(), n) << "rank " << r << " left the barrier early";
    group->Wait(r);
  }));
  for (int r = 0; r < n; ++r) {
    ExpectBitwiseEqual(data[r], TreeOrderSum(in, 0.5f), "sum");
    ExpectBitwiseEqual(first[r], RandomData(5, 20), "broadcast from rank 0");
  }
  group->Abort("test is over");
  EXPECT_TRUE(group->broken());
  std::vector<float> v(4, 1.0f);
  EXPECT_THROW(group->AllReduceSum(0, v.data(), 4, "after abort", 1.0f), CollectiveAborted);
}

}  // namespace
}  // namespace cnnflow
