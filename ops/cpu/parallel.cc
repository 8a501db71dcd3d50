#include "ops/cpu/parallel.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace cnnflow::cpu {

namespace {
#if defined(__SSE__)
constexpr unsigned kFlushDenormals = 0x8040;  // MXCSR: FTZ (bit 15) | DAZ (bit 6)
#endif
}  // namespace

std::unique_ptr<tbb::task_arena> MakeComputeArena(int threads, bool flush_denormals) {
  auto arena = std::make_unique<tbb::task_arena>(std::max(1, threads));
#if defined(__SSE__)
  // This thread's implicit arena first: made on its first parallel work,
  // it would take the flags below for good.
  tbb::parallel_for(0, 1, [](int) {});
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(flush_denormals ? saved | kFlushDenormals : saved & ~kFlushDenormals);
  arena->initialize();
  _mm_setcsr(saved);
#else
  (void)flush_denormals;
  arena->initialize();
#endif
  return arena;
}

}  // namespace cnnflow::cpu
