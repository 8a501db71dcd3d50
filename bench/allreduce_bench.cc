// allreduce_bench: the in-process all-reduce (LocalGroup::AllReduceMean)
// against the machine's memcpy bandwidth, measured in the same run on the
// same sizes.
//
//   allreduce_bench [--participants 2,3] [--sizes-mb 1,4,25,100] [--seconds 0.3]
//
// algbw = bucket bytes / time (what a training step sees); busbw = algbw *
// 2(N-1)/N (NCCL's convention, comparable across participant counts);
// traffic = bytes the reduction must move through memory (each of the N
// buffers read and written once: 2 N bytes) / time; memcpy traffic = 2 bytes
// per byte copied. The target (issue 4) is algbw >= 0.5 x memcpy for 25 MB
// buckets with 2 replicas.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_args.h"
#include "ops/collectives/collective.h"

namespace cnnflow {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;

using bench::ParseList;

// Repeats body() (which runs `reps` iterations) until it has run for about
// `seconds`, in 5 rounds; returns the best seconds per iteration (the
// machine may be shared: the best round is the least disturbed).
template <typename Body>
double TimePerIteration(double seconds, Body body) {
  // One untimed iteration touches the pages and warms the threads.
  body(1);
  auto t0 = Clock::now();
  body(1);
  const double one = std::max(1e-7, std::chrono::duration<double>(Clock::now() - t0).count());
  const int reps = std::max(2, static_cast<int>(seconds / 5 / one));
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    t0 = Clock::now();
    body(reps);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count() / reps);
  }
  return best;
}

// memcpy of `bytes` split over `threads` threads (each copies its half,
// all start together each iteration).
double MemcpySeconds(size_t bytes, int threads, double seconds) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  if (threads == 1) {
    return TimePerIteration(seconds, [&](int reps) {
      for (int i = 0; i < reps; ++i) {
        std::memcpy(dst.data(), src.data(), bytes);
        asm volatile("" ::"r"(dst.data()) : "memory");
      }
    });
  }
  return TimePerIteration(seconds, [&](int reps) {
    std::barrier sync(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const size_t b = bytes * t / threads, e = bytes * (t + 1) / threads;
        for (int i = 0; i < reps; ++i) {
          sync.arrive_and_wait();
          std::memcpy(dst.data() + b, src.data() + b, e - b);
        }
        sync.arrive_and_wait();
      });
    }
    for (auto& th : pool) th.join();
  });
}

// Seconds per all-reduce (mean) of `count` floats over n participants.
double AllReduceSeconds(int64_t count, int n, double seconds) {
  std::vector<std::vector<float>> bufs(n, std::vector<float>(count, 1.0f));
  LocalGroup group(n, 600.0, "bench");
  return TimePerIteration(seconds, [&](int reps) {
    std::vector<std::thread> pool;
    for (int r = 0; r < n; ++r) {
      pool.emplace_back([&, r] {
        for (int i = 0; i < reps; ++i) group.AllReduceMean(r, bufs[r].data(), count, "bench");
      });
    }
    for (auto& th : pool) th.join();
  });
}

int Main(int argc, char** argv) {
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<double> participants = {2};
  for (int n = 3; n <= hw; ++n) participants.push_back(n);
  std::vector<double> sizes_mb = {1, 4, 25, 100};
  double seconds = 0.3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--participants" && i + 1 < argc) {
      participants = ParseList(argv[++i]);
    } else if (a == "--sizes-mb" && i + 1 < argc) {
      sizes_mb = ParseList(argv[++i]);
    } else if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: allreduce_bench [--participants 2,3] [--sizes-mb 1,4,25,100] "
                   "[--seconds 0.3]\n");
      return 2;
    }
  }
  std::printf(
      "in-process all-reduce (mean, float32) vs memcpy; %d hardware threads; "
      "1 MB = 2^20 bytes; GB/s = 1e9 bytes/s\n\n",
      hw);
  std::printf("%8s %4s %10s %9s %9s %11s %11s %11s %8s %11s\n", "size_MB", "N", "time_ms", "algbw",
              "busbw", "traffic", "memcpy_1t", "memcpy_2t", "ratio", "traffic/mc");
  for (double mb : sizes_mb) {
    const size_t bytes = static_cast<size_t>(mb * kMiB) / 4 * 4;
    const double mc1 = bytes / MemcpySeconds(bytes, 1, seconds) / 1e9;
    const double mc2 = bytes / MemcpySeconds(bytes, 2, seconds) / 1e9;
    const double mc = std::max(mc1, mc2);
    for (double nd : participants) {
      const int n = static_cast<int>(nd);
      const double t = AllReduceSeconds(static_cast<int64_t>(bytes / 4), n, seconds);
      const double alg = bytes / t / 1e9;
      const double bus = alg * 2.0 * (n - 1) / n;
      const double traffic = 2.0 * n * bytes / t / 1e9;
      std::printf("%8.0f %4d %10.3f %9.2f %9.2f %11.2f %11.2f %11.2f %8.2f %11.2f\n", mb, n,
                  t * 1e3, alg, bus, traffic, mc1, mc2, alg / mc, traffic / (2 * mc));
    }
  }
  // Latency: a 4 KB bucket, for 1..threads participants.
  std::printf("\nlatency of a 4 KB all-reduce:");
  for (int n = 1; n <= std::max(2, hw); ++n) {
    std::printf("  N=%d %.1f us", n, AllReduceSeconds(1024, n, seconds) * 1e6);
  }
  std::printf(
      "\nratio = algbw / best memcpy GB/s; traffic/mc = memory traffic / best memcpy "
      "traffic\n");
  return 0;
}

}  // namespace
}  // namespace cnnflow

int main(int argc, char** argv) { return cnnflow::Main(argc, argv); }
