// What every call into oneDNN shares (convolutions, eltwise activations,
// the sgemm of ops/cpu/gemm.cc): the CPU engine, a stream per thread, and
// one OpenMP thread per calling thread.
#pragma once

#include <dnnl.hpp>

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

}  // namespace cnnflow::cpu
