// The CUDA backend: a caching device allocator per GPU (no cudaMalloc in the
// steady state) and copies between host and GPUs.
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>

#include "ops/device_backend.h"
#include "ops/error.h"

#define CNNFLOW_CUDA_CHECK(call)                                                       \
  do {                                                                                 \
    cudaError_t err_ = (call);                                                         \
    if (err_ != cudaSuccess) {                                                         \
      throw ::cnnflow::Error(::cnnflow::StrCat(#call, " failed: ", cudaGetErrorString(err_), \
                                               " (", __FILE__, ":", __LINE__, ")"));   \
    }                                                                                  \
  } while (0)

namespace cnnflow::detail {

namespace {

class CudaCachingPool final : public CachingPool {
 public:
  explicit CudaCachingPool(int index) : index_(index) {}

 protected:
  void* RawAllocate(size_t bytes) override {
    CNNFLOW_CUDA_CHECK(cudaSetDevice(index_));
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      (void)cudaGetLastError();  // clear it: the pool reports the failure
      return nullptr;
    }
    return p;
  }
  std::string name() const override { return StrCat("cuda:", index_); }

 private:
  int index_;
};

}  // namespace

bool CudaBuilt() { return true; }

int CudaDeviceCountImpl() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // e.g. "driver version is insufficient": no GPU here
      return 0;
    }
    return n;
  }();
  return count;
}

MemoryPool& CudaPool(int index) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<CudaCachingPool>>* pools =
      new std::map<int, std::unique_ptr<CudaCachingPool>>();
  std::lock_guard<std::mutex> lock(mu);
  if (index < 0 || index >= CudaDeviceCountImpl()) {
    throw Error(StrCat("no device cuda:", index, " (", CudaDeviceCountImpl(), " GPUs found)"));
  }
  auto& p = (*pools)[index];
  if (!p) p = std::make_unique<CudaCachingPool>(index);
  return *p;
}

void CudaCopy(Device dst_device, void* dst, Device src_device, const void* src, size_t bytes) {
  cudaMemcpyKind kind = cudaMemcpyDefault;  // unified addressing works out the direction
  if (dst_device.is_cuda()) CNNFLOW_CUDA_CHECK(cudaSetDevice(dst_device.index));
  else CNNFLOW_CUDA_CHECK(cudaSetDevice(src_device.index));
  CNNFLOW_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
}

void CudaZero(int index, void* ptr, size_t bytes) {
  CNNFLOW_CUDA_CHECK(cudaSetDevice(index));
  CNNFLOW_CUDA_CHECK(cudaMemset(ptr, 0, bytes));
}

}  // namespace cnnflow::detail
