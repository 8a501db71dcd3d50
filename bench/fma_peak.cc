// fma_peak: the machine's float32 FMA ceiling, and OpenBLAS's practical one.
//
// 1. FMA peak: each thread runs ACC independent FMA chains (acc = acc*a + b)
//    on full-width registers, ACC large enough to cover FMA latency times the
//    number of FMA ports (4-cycle latency x 2 ports needs 8; we use 16). One
//    FMA on a W-lane register is 2*W flops. Measured for AVX-512 (16 lanes)
//    and AVX2 (8 lanes), 1 thread and N threads (std::thread).
// 2. sgemm: OpenBLAS cblas_sgemm on an n x n x n product, 1 thread
//    (openblas_set_num_threads(1)) and N threads: the best a tuned library
//    gets out of the same silicon on a real kernel.
//
// Every figure is measured --reps times; prints the median and the best, one
// machine-readable line each:
//   fma_peak isa=avx512 threads=2 gflops_median=... gflops_best=...
//   sgemm n=2048 threads=1 gflops_median=... gflops_best=...
//
// Usage: fma_peak [--threads N] [--reps R] [--seconds S] [--n SIZE] [--no-sgemm]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <cblas.h>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

constexpr int kAcc = 16;  // independent chains per thread

// Runs `iters` rounds of kAcc FMAs; returns a value derived from every
// accumulator so the compiler must compute them all.
#if defined(__AVX512F__)
__attribute__((noinline)) float chains_avx512(long iters) {
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(1.0f + 0.01f * i);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < kAcc; ++i) s = _mm512_add_ps(s, acc[i]);
  float out[16];  // not _mm512_reduce_add_ps: GCC 12's header warns in it
  _mm512_storeu_ps(out, s);
  float r = 0;
  for (float x : out) r += x;
  return r;
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
__attribute__((noinline)) float chains_avx2(long iters) {
  __m256 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_set1_ps(1.0f + 0.01f * i);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < kAcc; ++i) s = _mm256_add_ps(s, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  float r = 0;
  for (float x : out) r += x;
  return r;
}
#endif

volatile float g_sink;

// GFLOP/s of `threads` threads each running fn(iters); flops per iteration
// per thread = kAcc * 2 * lanes.
double fma_gflops(float (*fn)(long), int lanes, int threads, long iters) {
  std::vector<std::thread> pool;
  std::vector<float> out(threads);
  auto t0 = Clock::now();
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { out[t] = fn(iters); });
  for (auto& th : pool) th.join();
  double dt = seconds_since(t0);
  for (float x : out) g_sink = x;
  return double(iters) * kAcc * 2 * lanes * threads / dt * 1e-9;
}

void run_fma(const char* isa, float (*fn)(long), int lanes, int threads, int reps,
             double seconds) {
  // Calibrate iterations on one thread so that one repetition lasts ~seconds.
  long iters = 1 << 16;
  for (;;) {
    auto t0 = Clock::now();
    g_sink = fn(iters);
    double dt = seconds_since(t0);
    if (dt > 0.05) {
      iters = long(iters * seconds / dt) + 1;
      break;
    }
    iters *= 4;
  }
  std::vector<double> g;
  for (int r = 0; r < reps; ++r) g.push_back(fma_gflops(fn, lanes, threads, iters));
  std::printf("fma_peak isa=%s threads=%d chains=%d gflops_median=%.1f gflops_best=%.1f\n",
              isa, threads, kAcc, median(g), *std::max_element(g.begin(), g.end()));
  std::fflush(stdout);
}

void run_sgemm(int n, int threads, int reps) {
  openblas_set_num_threads(threads);
  std::vector<float> A(size_t(n) * n), B(size_t(n) * n), C(size_t(n) * n);
  unsigned s = 12345;
  auto rnd = [&] { s = s * 1664525u + 1013904223u; return float(s >> 8) / float(1 << 24) - 0.5f; };
  for (auto& x : A) x = rnd();
  for (auto& x : B) x = rnd();
  auto once = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A.data(), n,
                B.data(), n, 0.0f, C.data(), n);
  };
  once();  // warm: page in, let OpenBLAS allocate its buffers
  std::vector<double> g;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    once();
    g.push_back(2.0 * n * n * double(n) / seconds_since(t0) * 1e-9);
  }
  g_sink = C[0];
  std::printf("sgemm n=%d threads=%d gflops_median=%.1f gflops_best=%.1f openblas=\"%s\" core=%s\n",
              n, threads, median(g), *std::max_element(g.begin(), g.end()),
              openblas_get_config(), openblas_get_corename());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int max_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  int reps = 5, n = 2048;
  double seconds = 0.2;
  bool sgemm = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--threads") max_threads = std::atoi(next());
    else if (a == "--reps") reps = std::atoi(next());
    else if (a == "--seconds") seconds = std::atof(next());
    else if (a == "--n") n = std::atoi(next());
    else if (a == "--no-sgemm") sgemm = false;
    else {
      std::fprintf(stderr,
                   "usage: fma_peak [--threads N] [--reps R] [--seconds S] [--n SIZE] [--no-sgemm]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  std::vector<int> counts{1};
  if (max_threads > 1) counts.push_back(max_threads);
  for (int t : counts) {
#if defined(__AVX512F__)
    run_fma("avx512", chains_avx512, 16, t, reps, seconds);
#endif
#if defined(__AVX2__) && defined(__FMA__)
    run_fma("avx2", chains_avx2, 8, t, reps, seconds);
#endif
  }
  if (sgemm)
    for (int t : counts) run_sgemm(n, t, reps);
  return 0;
}
