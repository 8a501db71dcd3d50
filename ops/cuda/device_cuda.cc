// The CUDA backend: a caching device allocator per GPU (no cudaMalloc in the
// steady state) and copies between host and GPUs.
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

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

namespace cnnflow {
size_t RoundToSizeClass(size_t bytes);  // ops/device.cc
}

namespace cnnflow::detail {

namespace {

class CudaCachingPool final : public MemoryPool {
 public:
  explicit CudaCachingPool(int index) : index_(index) {}
  void* Allocate(size_t bytes) override {
    const size_t size = RoundToSizeClass(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    auto& list = free_[size];
    void* p = nullptr;
    if (!list.empty()) {
      p = list.back();
      list.pop_back();
    } else {
      CNNFLOW_CUDA_CHECK(cudaSetDevice(index_));
      cudaError_t err = cudaMalloc(&p, size);
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        throw Error(StrCat("cuda:", index_, " out of memory: asked ", size, " bytes, ", in_use_,
                           " in use, ", reserved_, " reserved (", cudaGetErrorString(err), ")"));
      }
      reserved_ += size;
    }
    in_use_ += size;
    if (in_use_ > peak_) peak_ = in_use_;
    return p;
  }
  void Release(void* ptr, size_t bytes) override {
    const size_t size = RoundToSizeClass(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    in_use_ -= size;
    free_[size].push_back(ptr);
  }
  size_t bytes_in_use() const override { return in_use_; }
  size_t peak_bytes_in_use() const override { return peak_; }
  size_t bytes_reserved() const override { return reserved_; }

 private:
  int index_;
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  size_t in_use_ = 0, peak_ = 0, reserved_ = 0;
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
