// The vector instruction sets the CPU kernels of our own may use, chosen at
// run time: every fast path is compiled for its ISA with a target attribute
// (whatever -march says) and taken only where the CPU has it, so one binary
// is right and fast on AVX2-only and AVX-512 machines alike.
// CNNFLOW_MAX_ISA=scalar|avx2|avx512 caps it (as ONEDNN_MAX_CPU_ISA does
// oneDNN's); tests cap it with SetMaxIsa to check every path on one machine.
#pragma once

namespace cnnflow::cpu {

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// The best ISA this CPU has, capped by CNNFLOW_MAX_ISA and SetMaxIsa.
Isa MaxIsa();
// What the CPU itself supports (no cap).
Isa CpuIsa();
// Caps MaxIsa() from now on (tests; not thread-safe against running kernels).
void SetMaxIsa(Isa isa);
const char* IsaName(Isa isa);

}  // namespace cnnflow::cpu
