// fma_peak: the machine's float32 FMA ceiling, and OpenBLAS's practical one.
//
// 1. FMA peak: each thread runs C independent FMA chains (acc = acc*a + b)
//    on full-width registers. C must cover FMA latency x FMA ports (4-cycle
//    latency x 2 ports = 8 chains in flight on Skylake-X, Ice Lake,
//    Sapphire Rapids and Zen 2-4), and C chains + the 2 constants must fit
//    in the register file, or the compiler spills accumulators to the stack
//    and every chain gains a store-to-load round trip (that was the bug of
//    the first version: 16 AVX2 chains + 2 constants = 18 > 16 ymm
//    registers, 57 instead of ~100 GFLOP/s per thread on Zen3). So:
//      AVX2     16 ymm registers: C = 12 (14 registers used)
//      AVX-512  32 zmm registers: C = 24 (26 registers used)
//    One FMA on a W-lane register is 2*W flops. Every ISA the CPU offers is
//    measured (chosen at run time: each kernel is compiled for its own ISA
//    with a target attribute, whatever -march says), 1 thread and N threads
//    (std::thread). The inner loops have no memory operand; check with
//      objdump -d --no-show-raw-insn -C fma_peak | awk '/chains_avx2/,/ret/'
// 2. sgemm: OpenBLAS cblas_sgemm on an n x n x n product, 1 thread
//    (openblas_set_num_threads(1)) and N threads: the best a tuned library
//    gets out of the same silicon on a real kernel.
//
// Prints first what the CPU is (model, its SIMD flags from /proc/cpuinfo,
// and the ISA whose peak is the machine's: the widest one measured), then
// every figure, measured --reps times, median and best, one
// machine-readable line each:
//   cpu model="AMD EPYC" flags=avx2,fma peak_isa=avx2
//   fma_peak isa=avx2 threads=2 chains=12 gflops_median=... gflops_best=...
//   bf16_dot_peak isa=avx512_bf16 threads=2 chains=24 gflops_median=... (avx512_bf16 CPUs)
//   sgemm n=2048 threads=1 gflops_median=... gflops_best=... core=Haswell
//
// Usage: fma_peak [--threads N] [--reps R] [--seconds S] [--n SIZE] [--no-sgemm]
#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

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

// Independent chains per thread, per ISA (see the top of the file).
constexpr int kChainsAvx2 = 12;
constexpr int kChainsAvx512 = 24;

// Each kernel runs `iters` rounds of its chains' FMAs and returns a value
// derived from every accumulator, so the compiler must compute them all.
// `a` and `b` go through an empty asm so that they are live registers the
// compiler cannot fold into the FMAs as memory (broadcast) operands.
// The sum of every lane of n accumulators.
__attribute__((target("avx512f"))) float sum_avx512(const __m512* acc, int n) {
  __m512 s = acc[0];
  for (int i = 1; i < n; ++i) s = _mm512_add_ps(s, acc[i]);
  float out[16];  // not _mm512_reduce_add_ps: GCC 12's header warns in it
  _mm512_storeu_ps(out, s);
  float r = 0;
  for (float x : out) r += x;
  return r;
}

__attribute__((target("avx512f"), noinline)) float chains_avx512(long iters) {
  constexpr int C = kChainsAvx512;
  __m512 acc[C];
  for (int i = 0; i < C; ++i) acc[i] = _mm512_set1_ps(1.0f + 0.01f * i);
  __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  asm("" : "+v"(a), "+v"(b));
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 32
    for (int i = 0; i < C; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  return sum_avx512(acc, C);
}

// The same with bf16 dot products (vdpbf16ps: per f32 lane, two bf16
// products added to the accumulator, 4 flops), where the CPU has
// avx512_bf16: what bf16 convolutions without AMX can reach.
__attribute__((target("avx512f,avx512bf16"), noinline)) float chains_avx512_bf16(long iters) {
  constexpr int C = kChainsAvx512;
  __m512 acc[C];
  for (int i = 0; i < C; ++i) acc[i] = _mm512_set1_ps(1.0f + 0.01f * i);
  __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-4f), _mm512_set1_ps(1e-4f));
  asm("" : "+v"(a), "+v"(b));
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 32
    for (int i = 0; i < C; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  return sum_avx512(acc, C);
}

__attribute__((target("avx2,fma"), noinline)) float chains_avx2(long iters) {
  constexpr int C = kChainsAvx2;
  __m256 acc[C];
  for (int i = 0; i < C; ++i) acc[i] = _mm256_set1_ps(1.0f + 0.01f * i);
  __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  asm("" : "+x"(a), "+x"(b));
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 32
    for (int i = 0; i < C; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < C; ++i) s = _mm256_add_ps(s, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  float r = 0;
  for (float x : out) r += x;
  return r;
}

struct Isa {
  const char* name;
  float (*fn)(long);
  int lanes;   // floats per register
  int chains;  // FMAs per iteration per thread
  bool supported;
  int flops = 2;    // per lane and instruction
  bool f32 = true;  // an f32 FMA peak (else bf16 dot products: never peak_isa)
};

// The CPU's model name and the SIMD-relevant flags of /proc/cpuinfo's first
// processor ("-" where unreadable).
std::string cpuinfo_field(const char* key) {
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (!f) return "-";
  char line[8192];
  std::string v = "-";
  size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, key, n) == 0 && (line[n] == ' ' || line[n] == '\t' || line[n] == ':')) {
      const char* c = std::strchr(line, ':');
      if (c) {
        v = c + 1;
        while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.erase(v.begin());
        while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
      }
      break;
    }
  }
  std::fclose(f);
  return v;
}

std::string simd_flags() {
  std::string all = " ", out;  // " flag flag ... ", so that " avx2 " matches a whole flag
  all += cpuinfo_field("flags");
  all += ' ';
  for (const char* f : {"avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16",
                        "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"}) {
    if (all.find(std::string(" ") + f + " ") == std::string::npos) continue;
    if (!out.empty()) out += ',';
    out += f;
  }
  return out.empty() ? "none" : out;
}

volatile float g_sink;

// GFLOP/s of `threads` threads each running isa.fn(iters); flops per
// iteration per thread = chains * flops * lanes.
double fma_gflops(const Isa& isa, int threads, long iters) {
  std::vector<std::thread> pool;
  std::vector<float> out(threads);
  auto t0 = Clock::now();
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { out[t] = isa.fn(iters); });
  for (auto& th : pool) th.join();
  double dt = seconds_since(t0);
  for (float x : out) g_sink = x;
  return double(iters) * isa.chains * isa.flops * isa.lanes * threads / dt * 1e-9;
}

void run_fma(const Isa& isa, int threads, int reps, double seconds) {
  // Calibrate iterations on one thread so that one repetition lasts ~seconds.
  long iters = 1 << 16;
  for (;;) {
    auto t0 = Clock::now();
    g_sink = isa.fn(iters);
    double dt = seconds_since(t0);
    if (dt > 0.05) {
      iters = long(iters * seconds / dt) + 1;
      break;
    }
    iters *= 4;
  }
  std::vector<double> g;
  for (int r = 0; r < reps; ++r) g.push_back(fma_gflops(isa, threads, iters));
  std::printf("%s isa=%s threads=%d chains=%d gflops_median=%.1f gflops_best=%.1f\n",
              isa.f32 ? "fma_peak" : "bf16_dot_peak", isa.name, threads, isa.chains, median(g),
              *std::max_element(g.begin(), g.end()));
  std::fflush(stdout);
}

void run_sgemm(int n, int threads, int reps) {
  openblas_set_num_threads(threads);
  std::vector<float> A(size_t(n) * n), B(size_t(n) * n), C(size_t(n) * n);
  unsigned s = 12345;
  auto rnd = [&] {
    s = s * 1664525u + 1013904223u;
    return float(s >> 8) / float(1 << 24) - 0.5f;
  };
  for (auto& x : A) x = rnd();
  for (auto& x : B) x = rnd();
  auto once = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A.data(), n, B.data(), n,
                0.0f, C.data(), n);
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
              n, threads, median(g), *std::max_element(g.begin(), g.end()), openblas_get_config(),
              openblas_get_corename());
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
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads")
      max_threads = std::atoi(next());
    else if (a == "--reps")
      reps = std::atoi(next());
    else if (a == "--seconds")
      seconds = std::atof(next());
    else if (a == "--n")
      n = std::atoi(next());
    else if (a == "--no-sgemm")
      sgemm = false;
    else {
      std::fprintf(
          stderr,
          "usage: fma_peak [--threads N] [--reps R] [--seconds S] [--n SIZE] [--no-sgemm]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  __builtin_cpu_init();
  const Isa isas[] = {
      {"avx512", chains_avx512, 16, kChainsAvx512, bool(__builtin_cpu_supports("avx512f"))},
      {"avx2", chains_avx2, 8, kChainsAvx2,
       __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")},
      {"avx512_bf16", chains_avx512_bf16, 16, kChainsAvx512,
       bool(__builtin_cpu_supports("avx512bf16")), 4, false},
  };
  const char* peak_isa = "none";
  for (const Isa& isa : isas)
    if (isa.supported && isa.f32) {
      peak_isa = isa.name;
      break;
    }
  std::printf("cpu model=\"%s\" flags=%s peak_isa=%s\n", cpuinfo_field("model name").c_str(),
              simd_flags().c_str(), peak_isa);
  std::fflush(stdout);
  std::vector<int> counts{1};
  if (max_threads > 1) counts.push_back(max_threads);
  for (int t : counts)
    for (const Isa& isa : isas)
      if (isa.supported) run_fma(isa, t, reps, seconds);
  if (sgemm)
    for (int t : counts) run_sgemm(n, t, reps);
  return 0;
}
