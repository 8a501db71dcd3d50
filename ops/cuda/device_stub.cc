// The CUDA backend of a build without CUDA: no GPU, and a clear error if one
// is asked for.
#include "ops/device_backend.h"
#include "ops/error.h"

namespace cnnflow::detail {

namespace {
[[noreturn]] void NoCuda() {
  throw Error("this cnnflow was built without CUDA (CNNFLOW_WITH_CUDA=OFF): no cuda device");
}
}  // namespace

bool CudaBuilt() { return false; }
int CudaDeviceCountImpl() { return 0; }
MemoryPool& CudaPool(int) { NoCuda(); }
void CudaCopy(Device, void*, Device, const void*, size_t) { NoCuda(); }
void CudaZero(int, void*, size_t) { NoCuda(); }

}  // namespace cnnflow::detail
