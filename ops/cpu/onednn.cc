#include "ops/cpu/onednn.h"

#include <cpuid.h>
#include <omp.h>

#include <cstdlib>

#include "ops/cpu/isa.h"
#include "ops/error.h"

namespace cnnflow::cpu {

void OneOpenMpThreadHere() {
  thread_local bool pinned = false;
  if (!pinned) {
    omp_set_num_threads(1);
    pinned = true;
  }
}

dnnl::engine& OnednnEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& OnednnStream() {
  thread_local dnnl::stream stream(OnednnEngine());
  return stream;
}

bool CpuHasAvx512Bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1);
}

bool OnednnHasAvx512Core() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto avx512 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
  return (isa & avx512) == avx512;  // each ISA's value holds the bits of those below it
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
    const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
    return StrCat("this CPU has ", amx_bf16 ? "AMX-BF16" : "avx512_bf16",
                  " but oneDNN is capped below it (ONEDNN_MAX_CPU_ISA=", cap ? cap : "",
                  "), so bf16 would be emulated");
  }
  return "";
}

}  // namespace cnnflow::cpu
