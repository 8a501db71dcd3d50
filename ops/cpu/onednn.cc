#include "ops/cpu/onednn.h"

#include <omp.h>

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

}  // namespace cnnflow::cpu
