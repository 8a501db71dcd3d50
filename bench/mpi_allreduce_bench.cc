// mpi_allreduce_bench: the all-reduce across processes that training uses
// (MpiWorld::AllReduceSum, tree order from point-to-point messages) against
// Open MPI's own MPI_Allreduce, side by side in one run, alternating, on the
// same buffers. Run under mpirun; rank 0 prints.
//
//   mpirun -n 2 mpi_allreduce_bench [--sizes-mb 1,4,16,64] [--rounds 5] [--link-gbps 1]
//     [--leaves G]
//
// --leaves G times, beside them, the all-reduce of a run of G logical
// replicas split over the processes (8 over 3: 3 + 3 + 2; MpiWorld's
// partial-sum tree, ops/collectives/reduction_tree.h), each process
// handing in its partial sums, and prints the bytes it sends.
//
// algbw = bucket bytes / time; busbw = algbw * 2(W-1)/W (NCCL's convention:
// the bytes each process's link must carry, so busbw / link rate is the
// share of the link used). --link-gbps adds that share (the link's rate in
// Gb/s, 1e9 bits/s). Each cell: the median over rounds; each round times
// a few all-reduces of each kind, alternating.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_args.h"
#include "ops/collectives/collective_mpi.h"

namespace cnnflow {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;

using bench::ParseList;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per call of fn, over `reps` calls that every rank starts together.
template <typename Fn>
double Time(int reps, Fn fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) fn();
  double t = std::chrono::duration<double>(Clock::now() - t0).count() / reps;
  // The slowest rank's time is the collective's.
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

int Main(int argc, char** argv) {
  MpiWorld& world = MpiWorld::Get();
  if (!world.active()) {
    std::fprintf(stderr, "mpi_allreduce_bench: run me under mpirun (-n 2 or more)\n");
    return 2;
  }
  std::vector<double> sizes_mb = {1, 4, 16, 64};
  int rounds = 5;
  double link_gbps = 0;
  int leaves = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--sizes-mb" && i + 1 < argc) {
      sizes_mb = ParseList(argv[++i]);
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--link-gbps" && i + 1 < argc) {
      link_gbps = std::atof(argv[++i]);
    } else if (a == "--leaves" && i + 1 < argc) {
      leaves = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: mpi_allreduce_bench [--sizes-mb 1,4,16,64] [--rounds 5] "
                   "[--link-gbps G] [--leaves G]\n");
      return 2;
    }
  }
  const int w = world.size();
  if (leaves != 0 && leaves < w) {
    std::fprintf(stderr, "mpi_allreduce_bench: --leaves %d < %d processes\n", leaves, w);
    return 2;
  }
  // The split of the leaves, and this process's partial-sum buffers.
  std::vector<LeafRange> layout;
  for (int p = 0; leaves > 0 && p < w; ++p) layout.push_back(ProcessLeaves(p, w, leaves));
  const size_t partials =
      leaves > 0 ? TreeSegments(layout[world.rank()], leaves).size() : size_t{0};
  const bool print = world.rank() == 0;
  if (print) {
    std::printf("all-reduce (sum, float32) across %d processes; 1 MB = 2^20 bytes, GB/s = 1e9 B/s",
                w);
    if (link_gbps > 0) std::printf("; link %g Gb/s", link_gbps);
    std::printf("; median of %d rounds, alternating\n\n", rounds);
    std::printf("%8s  %-14s %9s %8s %8s %s\n", "size_MB", "all-reduce", "time_ms", "algbw", "busbw",
                link_gbps > 0 ? "busbw/link" : "");
  }
  for (double mb : sizes_mb) {
    const int64_t count = static_cast<int64_t>(mb * kMiB) / 4;
    std::vector<float> buf(count, 1.0f);
    // About 1 s of each per round at 1 Gb/s; at least 2 calls.
    const int reps = std::max(2, static_cast<int>(64 / std::max(1.0, mb)));
    std::vector<double> ours, theirs, split;
    std::vector<std::vector<float>> parts(partials, std::vector<float>(count, 1.0f));
    std::vector<float*> part_ptrs;
    for (auto& p : parts) part_ptrs.push_back(p.data());
    for (int r = 0; r < rounds; ++r) {
      ours.push_back(Time(reps, [&] { world.AllReduceSum(buf.data(), count, "bench", 600.0); }));
      if (leaves > 0) {
        split.push_back(Time(reps, [&] {
          MpiRequest q = world.StartAllReduceSum(part_ptrs, count, layout, "bench");
          world.Wait(q, 600.0);
        }));
        for (auto& p : parts) std::fill(p.begin(), p.end(), 1.0f);
      }
      theirs.push_back(Time(reps, [&] {
        MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
      }));
      std::fill(buf.begin(), buf.end(), 1.0f);  // keep the values finite
    }
    if (!print) continue;
    for (const auto& [name, times] :
         {std::pair<const char*, std::vector<double>&>{"cnnflow tree", ours},
          {"MPI_Allreduce", theirs},
          {"G leaves split", split}}) {
      if (times.empty()) continue;
      const double t = Median(times);
      const double alg = count * 4.0 / t / 1e9;
      const double bus = alg * 2.0 * (w - 1) / w;
      std::printf("%8.0f  %-14s %9.2f %8.3f %8.3f", mb, name, t * 1e3, alg, bus);
      if (link_gbps > 0) std::printf(" %9.0f%%", 100 * bus * 8 / link_gbps);
      std::printf("\n");
    }
  }
  if (print && leaves > 0) {
    const TreeTraffic t = TreeAllReduceTraffic(layout, 1);
    std::printf("\n%d leaves over %d processes (", leaves, w);
    for (int p = 0; p < w; ++p) std::printf("%s%d", p ? " + " : "", layout[p].size());
    std::printf("): per all-reduce of B bytes, %.2f B sent in all, at most %.2f B by one process\n",
                t.total_bytes / 4.0, t.max_process_bytes / 4.0);
  }
  return 0;
}

}  // namespace
}  // namespace cnnflow

int main(int argc, char** argv) { return cnnflow::Main(argc, argv); }
