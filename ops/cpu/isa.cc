#include "ops/cpu/isa.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cnnflow::cpu {
namespace {

Isa FromEnv(Isa cpu) {
  const char* v = std::getenv("CNNFLOW_MAX_ISA");
  if (v == nullptr || *v == '\0') return cpu;
  Isa want = cpu;
  if (std::strcmp(v, "scalar") == 0) {
    want = Isa::kScalar;
  } else if (std::strcmp(v, "avx2") == 0) {
    want = Isa::kAvx2;
  } else if (std::strcmp(v, "avx512") == 0) {
    want = Isa::kAvx512;
  } else {
    std::fprintf(stderr, "cnnflow: CNNFLOW_MAX_ISA=%s is not scalar, avx2 or avx512; ignored\n", v);
  }
  return want < cpu ? want : cpu;
}

std::atomic<int>& Cap() {
  static std::atomic<int> cap{static_cast<int>(FromEnv(CpuIsa()))};
  return cap;
}

}  // namespace

Isa CpuIsa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
      return Isa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
    return Isa::kScalar;
  }();
  return isa;
}

Isa MaxIsa() { return static_cast<Isa>(Cap().load(std::memory_order_relaxed)); }

void SetMaxIsa(Isa isa) {
  const Isa cpu = CpuIsa();
  Cap().store(static_cast<int>(isa < cpu ? isa : cpu), std::memory_order_relaxed);
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

}  // namespace cnnflow::cpu
