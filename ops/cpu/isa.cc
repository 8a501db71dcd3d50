#include "ops/cpu/isa.h"

#include <cpuid.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>

#include "ops/error.h"

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

std::string NoNativeBf16Reason() {
  // CPUID leaf 7: sub-leaf 1 EAX bit 5 is AVX512_BF16, sub-leaf 0 EDX bit 22
  // AMX-BF16.
  unsigned a = 0, b = 0, c = 0, d = 0;
  bool avx512_bf16 = false, amx_bf16 = false;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) amx_bf16 = (d >> 22) & 1;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) avx512_bf16 = (a >> 5) & 1;
  if (!avx512_bf16 && !amx_bf16) {
    return StrCat(
        "this CPU has neither avx512_bf16 nor AMX-BF16 (its best vector ISA: ", IsaName(CpuIsa()),
        "), so bf16 would be emulated, about 3x slower than fp32; train in fp32 here");
  }
  const auto onednn = dnnl::get_effective_cpu_isa();
  if (onednn != dnnl::cpu_isa::avx512_core_bf16 && onednn != dnnl::cpu_isa::avx512_core_amx) {
    return StrCat("this CPU has ", amx_bf16 ? "AMX-BF16" : "avx512_bf16",
                  " but oneDNN is capped below it (ONEDNN_MAX_CPU_ISA=",
                  std::getenv("ONEDNN_MAX_CPU_ISA") ? std::getenv("ONEDNN_MAX_CPU_ISA") : "",
                  "), so bf16 would be emulated");
  }
  return "";
}

}  // namespace cnnflow::cpu
