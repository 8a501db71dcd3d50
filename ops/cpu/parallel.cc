#include "ops/cpu/parallel.h"

#include <cblas.h>

#include <mutex>

extern "C" void omp_set_num_threads(int) __attribute__((weak));

namespace cnnflow::cpu {

void PinLibraryThreads() {
  static std::once_flag once;
  std::call_once(once, [] {
    openblas_set_num_threads(1);
    if (omp_set_num_threads != nullptr) omp_set_num_threads(1);
  });
}

}  // namespace cnnflow::cpu
