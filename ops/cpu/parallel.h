// Parallel loops for CPU kernels. TBB owns every thread (the run's thread
// budget); the GEMM libraries run one thread per call (ops/cpu/gemm.cc) so
// they never fight TBB for cores (see TOOLCHAIN.md).
//
// Reductions are deterministic: work is cut into a fixed number of chunks
// that depends only on the problem size, never on the thread count, and
// partial sums are added in chunk order. So a run gives bitwise the same
// result with 1 or 16 threads.
#pragma once

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>

namespace cnnflow::cpu {

// Number of chunks for n items with at least `min_per_chunk` each; at most
// kMaxChunks. Independent of the thread count.
inline constexpr int64_t kMaxChunks = 16;
inline int64_t NumChunks(int64_t n, int64_t min_per_chunk = 1) {
  if (n <= 0) return 0;
  return std::clamp<int64_t>(n / std::max<int64_t>(min_per_chunk, 1), 1, std::min(n, kMaxChunks));
}

// fn(chunk, begin, end) for each of `chunks` contiguous ranges of [0, n),
// in parallel.
template <typename Fn>
void ForChunks(int64_t n, int64_t chunks, Fn&& fn) {
  if (chunks <= 1) {
    if (n > 0) fn(int64_t{0}, int64_t{0}, n);
    return;
  }
  tbb::parallel_for(int64_t{0}, chunks,
                    [&](int64_t c) { fn(c, n * c / chunks, n * (c + 1) / chunks); });
}

// fn(begin, end) over [0, n) in parallel, for loops whose iterations are
// independent (no reduction): any split gives the same result.
template <typename Fn>
void ParallelFor(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= grain) {
    if (n > 0) fn(int64_t{0}, n);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, std::max<int64_t>(grain, 1)),
                    [&](const tbb::blocked_range<int64_t>& r) { fn(r.begin(), r.end()); });
}

// A task arena of `threads` slots for a run's kernels. flush_denormals:
// its tasks treat denormal floats (below 1.2e-38 in f32) as zero, in and
// out (x86's DAZ and FTZ), as TensorFlow's and XLA's CPU threads do: an
// operation on one costs ~100x a normal one on x86, and early training
// makes many (bench/results/2026-12-06-cpu-flush-denormals.md).
// Otherwise IEEE's gradual underflow. TBB runs every
// task of an arena with the floating-point settings of the thread that
// initialised it (nested algorithms and flow graphs included), so the
// flags are set on the calling thread for the initialisation only.
std::unique_ptr<tbb::task_arena> MakeComputeArena(int threads, bool flush_denormals);

}  // namespace cnnflow::cpu
