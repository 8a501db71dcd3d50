// The CUDA backend: a caching device allocator per GPU (no cudaMalloc in the
// steady state) and copies between host and GPUs.
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <map>
#include <memory>
#include <mutex>

#include "ops/cuda/context.h"
#include "ops/cuda/cublas_api.h"
#include "ops/cuda/cuda_check.h"
#include "ops/device_backend.h"
#include "ops/error.h"

namespace cnnflow::detail {

namespace {

class CudaCachingPool final : public CachingPool {
 public:
  explicit CudaCachingPool(int index) : index_(index) {}

 protected:
  void* RawAllocate(size_t bytes) override {
    // A step being captured as a CUDA graph (ops/parallel/step_graph.h) may
    // ask for a new block: its cudaMalloc is no part of the captured work
    // (the pool reserves the block for the graph), so the capture may let
    // it pass, as PyTorch's allocator does.
    struct RelaxedCapture {
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode); }
      ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode); }
    } relaxed;
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
  // By (GPU, lane): a lane's blocks are reused only by work on its own stream.
  static auto* pools = new std::map<std::pair<int, int>, std::unique_ptr<CudaCachingPool>>();
  std::lock_guard<std::mutex> lock(mu);
  if (index < 0 || index >= CudaDeviceCountImpl()) {
    throw Error(StrCat("no device cuda:", index, " (", CudaDeviceCountImpl(), " GPUs found)"));
  }
  auto& p = (*pools)[{index, CurrentGpuLane()}];
  if (!p) p = std::make_unique<CudaCachingPool>(index);
  return *p;
}

// Copies run on the GPU's compute stream (context.h), so they come after
// every kernel issued before them. The host waits for a copy to the host (to
// read it at once) and for one from pinned host memory (which the caller
// may reuse at once); from pageable memory cudaMemcpyAsync has taken the
// data before it returns.
void CudaCopy(Device dst_device, void* dst, Device src_device, const void* src, size_t bytes) {
  const Device gpu = dst_device.is_cuda() ? dst_device : src_device;
  CudaContext& ctx = CudaContext::For(gpu);
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device != src_device) {
    // Peer copy: the source's pending work must be done too.
    CudaContext::Get(src_device.index).Synchronize();
  }
  CNNFLOW_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ctx.stream()));
  bool wait = dst_device.is_cpu() || dst_device != src_device;
  if (src_device.is_cpu()) {
    cudaPointerAttributes attr{};
    wait = cudaPointerGetAttributes(&attr, src) != cudaSuccess ||
           attr.type != cudaMemoryTypeUnregistered;
    (void)cudaGetLastError();
  }
  if (wait) ctx.Synchronize();
}

std::string CudaDescription() {
  auto version = [](int v) { return StrCat(v / 1000, ".", (v % 1000) / 10); };
  std::string out = StrCat("CUDA runtime ", version(CUDART_VERSION), " (built with)");
  int driver = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) {
    out += StrCat(", driver supports CUDA ", version(driver));
  } else {
    out += ", no CUDA driver";
  }
  (void)cudaGetLastError();
  const size_t cudnn = cudnnGetVersion();
  std::string cublas;
  try {
    int major = 0, minor = 0;
    Cublas().GetProperty(MAJOR_VERSION, &major);
    Cublas().GetProperty(MINOR_VERSION, &minor);
    cublas = StrCat(major, ".", minor);
  } catch (const Error& e) {
    cublas = StrCat("not loadable (", e.what(), ")");
  }
  int nccl = 0;
  ncclGetVersion(&nccl);
  out += StrCat("\ncuDNN ", cudnn / 10000, ".", (cudnn % 10000) / 100, ".", cudnn % 100,
                ", cuBLAS ", cublas, ", NCCL ", nccl / 10000, ".", (nccl % 10000) / 100, ".",
                nccl % 100, " (loaded)\n");
  const int n = CudaDeviceCountImpl();
  if (n == 0) {
    int probe = 0;
    const cudaError_t err = cudaGetDeviceCount(&probe);
    (void)cudaGetLastError();
    return out +
           StrCat("no GPU: ", err == cudaSuccess ? "none found" : cudaGetErrorString(err), "\n");
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
      (void)cudaGetLastError();
      out += StrCat("cuda:", i, ": properties unavailable\n");
      continue;
    }
    out += StrCat("cuda:", i, ": ", p.name, ", ", p.totalGlobalMem / (1 << 20), " MiB, compute ",
                  p.major, ".", p.minor, ", ", p.multiProcessorCount, " SMs\n");
  }
  return out;
}

void CudaZero(int index, void* ptr, size_t bytes) {
  CudaContext& ctx = CudaContext::For(Device::Cuda(index));
  CNNFLOW_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, ctx.stream()));
}

}  // namespace cnnflow::detail
