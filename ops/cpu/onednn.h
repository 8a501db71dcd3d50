// What every call into oneDNN shares (convolutions, eltwise activations,
// the sgemm of ops/cpu/gemm.cc): the CPU engine, a stream per thread, and
// one OpenMP thread per calling thread.
#pragma once

#include <dnnl.hpp>
#include <string>

namespace cnnflow::cpu {

// Calls omp_set_num_threads(1) once per calling thread (OpenMP's thread
// count is per thread): TBB owns the parallelism, and an OpenMP team per TBB
// worker would oversubscribe the cores (7-20x slower, TOOLCHAIN.md). Every
// call into oneDNN goes through it.
void OneOpenMpThreadHere();

// The one CPU engine.
dnnl::engine& OnednnEngine();
// This thread's stream: each call executes on its own thread, synchronously.
dnnl::stream& OnednnStream();

// Native bf16 (graph.precision: bf16 on CPU devices): "" when this CPU has
// avx512_bf16 or AMX-BF16 and oneDNN runs them (ONEDNN_MAX_CPU_ISA may cap
// it below); else why not, naming the missing feature, for the error. Never
// emulated: oneDNN's bf16 on other CPUs runs ~3x slower than its f32, and on
// AVX2-only CPUs it has no bf16 convolution at all.
std::string NoNativeBf16Reason();
// Whether this CPU has avx512_bf16 (vcvtneps2bf16, which our own bf16
// conversions use).
bool CpuHasAvx512Bf16();
// Whether oneDNN runs its AVX-512 kernels here (avx512_core or above, not
// capped by ONEDNN_MAX_CPU_ISA): where it has f32 convolutions that read and
// write channels-last tensors as they are (brgemm forward, jit backward).
bool OnednnHasAvx512Core();

}  // namespace cnnflow::cpu
