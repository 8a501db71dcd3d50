// The MPI collectives across real processes. Run by ctest as
//   mpiexec -n 2 collective_mpi_test              all checks; exit 0 when all pass
//   mpiexec -n 2 collective_mpi_test --early-exit rank 1 leaves without joining an
//     all-reduce; rank 0 must fail within the timeout with the promised message
//     (the job then ends through MPI_Abort, so ctest matches the output).
// A plain main, no GoogleTest: every rank runs the same checks, the failure
// counts are gathered, and every rank prints its verdict.
#include "ops/collectives/collective_mpi.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ops/collectives/collective.h"
#include "ops/parallel/tensor_parallel.h"
#include "ops/random.h"
#include "tests/testing/collective_data.h"

namespace cnnflow {
namespace {

constexpr double kTimeout = 20.0;  // only reached when something is broken
int g_rank = 0;
int g_checks = 0;
int g_failures = 0;

#define CHECK(cond, ...)                                                                        \
  do {                                                                                          \
    ++g_checks;                                                                                 \
    if (!(cond)) {                                                                              \
      ++g_failures;                                                                             \
      std::fprintf(stderr, "rank %d: FAILED %s:%d: %s %s\n", g_rank, __FILE__, __LINE__, #cond, \
                   ::cnnflow::StrCat("" __VA_OPT__(, ) __VA_ARGS__).c_str());                   \
    }                                                                                           \
  } while (0)

using testing::RandomData;
using testing::TreeOrderSum;

uint64_t HashBytes(const void* data, size_t n) {  // FNV-1a
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i)
    h = (h ^ static_cast<const unsigned char*>(data)[i]) * 1099511628211ull;
  return h;
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Rank-dependent integers whose sum is exact in float: the formula is the
// reference.
void AllReduceMatchesTheFormula(MpiWorld& world) {
  const int p = world.size();
  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000003}}) {
    std::vector<float> v(count);
    for (int64_t i = 0; i < count; ++i) v[i] = (world.rank() + 1) * 1000.0f + i % 1000;
    world.AllReduceSum(v.data(), count, StrCat("formula ", count), kTimeout);
    int bad = 0;
    for (int64_t i = 0; i < count; ++i) {
      const float want = 1000.0f * p * (p + 1) / 2 + static_cast<float>(p * (i % 1000));
      if (v[i] != want && bad++ == 0) {
        CHECK(v[i] == want, "count ", count, " element ", i, ": ", v[i], " vs ", want);
      }
    }
    CHECK(bad == 0, count, " floats: ", bad, " wrong elements");
  }
  // Two in flight, started in the same order on every rank, completed in
  // the opposite order.
  std::vector<float> a(5000, world.rank() + 1.0f), b(300, 10.0f * (world.rank() + 1));
  MpiRequest ra = world.StartAllReduceSum(a.data(), a.size(), "in flight a");
  MpiRequest rb = world.StartAllReduceSum(b.data(), b.size(), "in flight b");
  world.Wait(rb, kTimeout);
  world.Wait(ra, kTimeout);
  const float ranks_sum = p * (p + 1) / 2.0f;
  CHECK(a[0] == ranks_sum && a[4999] == ranks_sum, a[0], " ", a[4999]);
  CHECK(b[0] == 10 * ranks_sum && b[299] == 10 * ranks_sum, b[0], " ", b[299]);
}

void BroadcastAndGather(MpiWorld& world) {
  std::string s(1001, '.');
  if (world.rank() == 1) s = std::string(1000, 'y') + "!";
  world.BroadcastBytes(s.data(), s.size(), 1, "config text", kTimeout);
  CHECK(s == std::string(1000, 'y') + "!", s.substr(0, 20));
  const auto all = world.AllGather(100 + world.rank(), "ranks", kTimeout);
  CHECK(static_cast<int>(all.size()) == world.size());
  for (int r = 0; r < static_cast<int>(all.size()); ++r) CHECK(all[r] == 100u + r, all[r]);
  world.Barrier("barrier", kTimeout);
}

void HashAgreement(MpiWorld& world) {
  try {
    world.AgreeOnHash(0x1234abcd, "graph and parameter shapes", kTimeout);
    CHECK(true);
  } catch (const std::exception& e) {
    CHECK(false, "equal hashes were refused: ", e.what());
  }
  // Rank 1 runs a different graph: every rank must fail, naming it.
  const uint64_t mine = world.rank() == 1 ? 0xbad : 0x1234abcd;
  std::string msg;
  try {
    world.AgreeOnHash(mine, "graph and parameter shapes", kTimeout);
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK(Contains(msg, "graph and parameter shapes differ across the 2 processes"), msg);
  CHECK(Contains(msg, "rank 0 has 0x000000001234abcd; rank 1 has 0x0000000000000bad"), msg);
  CHECK(Contains(msg, "Rank 1 differs from rank 0"), msg);
  CHECK(Contains(msg, StrCat("rank ", world.rank(), " of 2")), msg);
}

// Start-up (MpiWorld::BeginStartup): a collective waits the start-up
// deadline, not its caller's timeout, so a rank 1.5 s late passes a 0.5 s
// timeout; after EndStartup the caller's timeout is back.
void StartupDeadline(MpiWorld& world) {
  MpiWorld::BeginStartup(kTimeout);
  const MpiWorld::WaitLimit during = MpiWorld::LimitFor(0.5);
  CHECK(during.startup && during.seconds == kTimeout, during.seconds);
  CHECK(during.Text() == "20 s (the start-up deadline, graph.startup_timeout_s)", during.Text());
  if (world.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const auto all = world.AllGather(7 + world.rank(), "late rank at start-up", 0.5);
  CHECK(all.size() == 2u && all[1] == 8u);
  MpiWorld::EndStartup();
  const MpiWorld::WaitLimit after = MpiWorld::LimitFor(0.5);
  CHECK(!after.startup && after.seconds == 0.5, after.seconds);
  CHECK(after.Text() == "0.5 s", after.Text());
}

// 2 processes x 2 local replicas against one process with 4 replicas.
void Hierarchical(MpiWorld& world) {
  const int kLocal = 2;
  LocalGroup local(kLocal, kTimeout, "replicas");
  HierarchicalAllReduce hier(local, world, kTimeout);
  CHECK(hier.global_size() == kLocal * world.size(), hier.global_size());
  CHECK(hier.global_offset() == kLocal * world.rank(), hier.global_offset());
  const int global = hier.global_size();

  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{100003}}) {
    // Every process can make every replica's data, so each computes the
    // single-process reference itself.
    std::vector<std::vector<float>> all(global);
    for (int g = 0; g < global; ++g) all[g] = RandomData(count, 500 + g);
    std::vector<std::vector<float>> flat = all;
    LocalGroup one_process(global, kTimeout, "reference");
    std::vector<std::thread> threads;
    for (int g = 0; g < global; ++g) {
      threads.emplace_back(
          [&, g] { one_process.AllReduceSum(g, flat[g].data(), count, "reference"); });
    }
    for (auto& t : threads) t.join();
    threads.clear();

    std::vector<std::vector<float>> sum(kLocal), mean(kLocal);
    for (int l = 0; l < kLocal; ++l) sum[l] = mean[l] = all[hier.global_offset() + l];
    for (int l = 0; l < kLocal; ++l) {
      threads.emplace_back([&, l] {
        hier.AllReduceSum(l, sum[l].data(), count, StrCat("bucket sum ", count));
        hier.AllReduceMean(l, mean[l].data(), count, StrCat("bucket mean ", count));
      });
    }
    for (auto& t : threads) t.join();

    // Summed in a different order than the single process, so within the
    // rounding of a 4-term float sum: |error| <= 3 eps sum |x_g|.
    int bad = 0;
    for (int64_t i = 0; i < count; ++i) {
      double abs_sum = 0;
      for (int g = 0; g < global; ++g) abs_sum += std::fabs(all[g][i]);
      const double tol = 3 * std::numeric_limits<float>::epsilon() * abs_sum;
      if (std::fabs(static_cast<double>(sum[0][i]) - flat[0][i]) > tol && bad++ == 0) {
        CHECK(false, "element ", i, ": hierarchical ", sum[0][i], " vs one process ", flat[0][i]);
      }
      // The mean is the sum scaled by 1/4 (exact for a power of two).
      if (mean[0][i] != sum[0][i] * 0.25f && bad++ == 0) {
        CHECK(false, "element ", i, ": mean ", mean[0][i], " vs sum / 4 ", sum[0][i] * 0.25f);
      }
    }
    CHECK(bad == 0, count, " floats: ", bad, " elements off");
    // Every replica of every process holds the same bits. (An empty vector's
    // data() may be null, and memcmp's pointers must not be, even for 0 bytes.)
    CHECK(count == 0 || std::memcmp(sum[0].data(), sum[1].data(), count * sizeof(float)) == 0);
    CHECK(count == 0 || std::memcmp(mean[0].data(), mean[1].data(), count * sizeof(float)) == 0);
    try {
      world.AgreeOnHash(HashBytes(sum[0].data(), count * sizeof(float)), "hierarchical results",
                        kTimeout);
      CHECK(true);
    } catch (const std::exception& e) {
      CHECK(false, e.what());
    }
  }

  // Broadcast from process 0's replica 0 to every replica.
  std::vector<std::vector<float>> p(kLocal);
  for (int l = 0; l < kLocal; ++l) p[l] = RandomData(1001, 900 + hier.global_offset() + l);
  const std::vector<float> want = RandomData(1001, 900);
  std::vector<std::thread> threads;
  for (int l = 0; l < kLocal; ++l) {
    threads.emplace_back([&, l] { hier.Broadcast(l, p[l].data(), 1001, "parameters"); });
  }
  for (auto& t : threads) t.join();
  for (int l = 0; l < kLocal; ++l) CHECK(p[l] == want, "replica ", l, " after broadcast");
}

// The path a training step takes: 2 local replicas average a bucket through
// the hierarchical all-reduce; rank 1 leaves after start-up. Both replicas
// of rank 0 must fail within the 1 s timeout, naming the rank and the bucket.
int EarlyExit(MpiWorld& world) {
  LocalGroup local(2, 1.0, "replicas");
  HierarchicalAllReduce hier(local, world, 1.0);
  if (world.rank() == 1) {
    std::printf("rank 1: leaving early, without joining the all-reduce\n");
    std::fflush(stdout);
    return 0;
  }
  std::vector<std::thread> threads;
  std::vector<std::string> results(2);
  for (int l = 0; l < 2; ++l) {
    threads.emplace_back([&, l] {
      std::vector<float> v(1000, 1.0f);
      const auto t0 = std::chrono::steady_clock::now();
      try {
        hier.AllReduceMean(l, v.data(), v.size(), "bucket 3 (fc1.weight..conv2.bias)");
        results[l] = "the all-reduce completed without rank 1";
      } catch (const CollectiveTimeout& e) {
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        char head[64];
        std::snprintf(head, sizeof(head), "CollectiveTimeout after %.1f s: ", s);
        results[l] = head + std::string(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int l = 0; l < 2; ++l) std::printf("rank 0 replica %d: %s\n", l, results[l].c_str());
  std::fflush(stdout);
  world.AbortJob(3);  // the MPI state is broken: end the job (what cnnflow train does)
}

// A tensor-parallel group that spans the two processes, one member each:
// the split conv2d (column and row) gives each process the unsplit layer's
// output and input gradient, which each process also computes alone.
void TensorParallelAcrossProcesses(MpiWorld& world) {
  HierarchicalAllReduce group(1, world, kTimeout);
  Args args;
  args.Set("out", int64_t{5});
  args.Set("kernel", int64_t{3});
  args.Set("pad", int64_t{1});
  const LayerType* type = LayerRegistry::Get().Find("conv2d");
  args.FillDefaults(type->schema);
  const Shape in{7, 6, 5};
  auto full = type->create("tp", args);
  const Shape out = full->Build({in}, DType::kF32);
  Rng rng(3);
  full->ResetParameters(rng);
  auto random = [](const Shape& s, uint64_t seed) {
    Tensor t = Tensor::Empty(s);
    const std::vector<float> v = RandomData(t.numel(), seed);
    std::memcpy(t.data<float>(), v.data(), v.size() * sizeof(float));
    return t;
  };
  const Tensor x = random(in.WithBatch(2), 41), dy = random(out.WithBatch(2), 42);
  Tensor y = Tensor::Empty(out.WithBatch(2)), dx = Tensor::Empty(x.shape());
  full->Forward({&x}, y, ForwardContext{});
  full->Backward({&x}, y, dy, {&dx});
  for (TensorSplit split : {TensorSplit::kColumn, TensorSplit::kRow}) {
    TensorParallelShard shard("tp", "conv2d", args, in, split, group, 0);
    CHECK(shard.range().size() == (split == TensorSplit::kColumn ? (world.rank() == 0 ? 3 : 2)
                                                                 : (world.rank() == 0 ? 4 : 3)),
          shard.range().size());
    shard.LoadFull(full->parameters());
    Tensor ty = Tensor::Empty(out.WithBatch(2)), tdx = Tensor::Empty(x.shape());
    shard.Forward(x, ty, ForwardContext{});
    shard.Backward(x, dy, &tdx);
    double worst_y = 0, worst_dx = 0;
    for (int64_t i = 0; i < y.numel(); ++i)
      worst_y = std::max(worst_y, std::fabs(ty.At(i) - y.At(i)));
    for (int64_t i = 0; i < dx.numel(); ++i)
      worst_dx = std::max(worst_dx, std::fabs(tdx.At(i) - dx.At(i)));
    CHECK(worst_y < 1e-5, TensorSplitName(split), " y off by ", worst_y);
    CHECK(worst_dx < 1e-5, TensorSplitName(split), " dx off by ", worst_dx);
  }
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Any world size: the all-reduce across processes is the tree-order sum,
// bit for bit, at sizes that leave ranks with empty halves and sizes above
// a ring's segments; and 2 replicas per process (HierarchicalAllReduce)
// give the tree over all 2 W replicas, as one process with 2 W would.
void TreeOrderAtAnyWorldSize(MpiWorld& world) {
  const int w = world.size();
  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{1000}, int64_t{300007}}) {
    std::vector<std::vector<float>> all(w);
    for (int r = 0; r < w; ++r) all[r] = RandomData(count, 7000 + 10 * r + count);
    std::vector<float> mine = all[world.rank()];
    world.AllReduceSum(mine.data(), count, "tree order", kTimeout);
    CHECK(BitwiseEqual(mine, TreeOrderSum(all, 0, w)), count, " floats over ", w, " ranks");
  }
  const int64_t count = 50001;
  std::vector<std::vector<float>> all(2 * w);
  for (int g = 0; g < 2 * w; ++g) all[g] = RandomData(count, 900 + g);
  const std::vector<float> want = TreeOrderSum(all, 0, 2 * w);
  HierarchicalAllReduce group(2, world, kTimeout);
  std::vector<float> data[2] = {all[2 * world.rank()], all[2 * world.rank() + 1]};
  std::thread other([&] { group.AllReduceSum(1, data[1].data(), count, "2 replicas"); });
  group.AllReduceSum(0, data[0].data(), count, "2 replicas");
  other.join();
  CHECK(BitwiseEqual(data[0], want) && BitwiseEqual(data[1], want), "2 replicas x ", w,
        " processes");
}

int Main(int argc, char** argv) {
  MpiWorld& world = MpiWorld::Get();
  g_rank = world.rank();
  if (!world.active() || world.size() < 2) {
    std::fprintf(stderr, "collective_mpi_test: run me with `mpiexec -n 2` (world size %d)\n",
                 world.size());
    return 2;
  }
  if (argc > 1 && std::strcmp(argv[1], "--early-exit") == 0) return EarlyExit(world);

  // The tests written for two ranks run at size 2; the tree order at any.
  std::vector<std::pair<const char*, std::function<void(MpiWorld&)>>> tests = {
      {"TreeOrderAtAnyWorldSize", TreeOrderAtAnyWorldSize}};
  if (world.size() == 2) {
    tests.insert(tests.end(), {{"AllReduceMatchesTheFormula", AllReduceMatchesTheFormula},
                               {"BroadcastAndGather", BroadcastAndGather},
                               {"HashAgreement", HashAgreement},
                               {"StartupDeadline", StartupDeadline},
                               {"Hierarchical", Hierarchical},
                               {"TensorParallelAcrossProcesses", TensorParallelAcrossProcesses}});
  }
  for (const auto& [name, fn] : tests) {
    const int before = g_failures;
    try {
      fn(world);
    } catch (const std::exception& e) {
      // The other rank may be waiting in a collective: end the job rather
      // than leave it to its timeout.
      std::fprintf(stderr, "rank %d: %s threw: %s\n", g_rank, name, e.what());
      world.AbortJob(1);
    }
    std::printf("rank %d: %s %s\n", g_rank, name, g_failures == before ? "passed" : "FAILED");
  }
  const auto failures = world.AllGather(g_failures, "failure counts", kTimeout);
  uint64_t total = 0;
  for (uint64_t f : failures) total += f;
  std::printf("rank %d: %d checks, %d failed here, %llu failed on all ranks\n", g_rank, g_checks,
              g_failures, static_cast<unsigned long long>(total));
  return total == 0 ? 0 : 1;
}

}  // namespace
}  // namespace cnnflow

int main(int argc, char** argv) { return cnnflow::Main(argc, argv); }
