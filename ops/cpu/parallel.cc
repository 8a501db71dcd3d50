#include "ops/cpu/parallel.h"

#include <cblas.h>

#include <mutex>

namespace cnnflow::cpu {

void PinLibraryThreads() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace cnnflow::cpu
