// The vector instruction sets the CPU kernels of our own may use, chosen at
// run time: every fast path is compiled for its ISA with a target attribute
// (whatever -march says) and taken only where the CPU has it, so one binary
// is right and fast on AVX2-only and AVX-512 machines alike.
// CNNFLOW_MAX_ISA=scalar|avx2|avx512 caps it (as ONEDNN_MAX_CPU_ISA does
// oneDNN's); tests cap it with SetMaxIsa to check every path on one machine.
#pragma once

#include <string>

namespace cnnflow::cpu {

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// The best ISA this CPU has, capped by CNNFLOW_MAX_ISA and SetMaxIsa.
Isa MaxIsa();
// What the CPU itself supports (no cap).
Isa CpuIsa();
// Caps MaxIsa() from now on (tests; not thread-safe against running kernels).
void SetMaxIsa(Isa isa);
const char* IsaName(Isa isa);

// Native bf16 (graph.precision: bf16 on CPU devices): "" when this CPU has
// avx512_bf16 or AMX-BF16 and oneDNN runs them (ONEDNN_MAX_CPU_ISA may cap
// it below); else why not, naming the missing feature, for the error. Never
// emulated: oneDNN's bf16 on other CPUs runs ~3x slower than its f32, and on
// AVX2-only CPUs it has no bf16 convolution at all.
std::string NoNativeBf16Reason();

}  // namespace cnnflow::cpu
