#include "ops/cuda/context.h"

#include <map>
#include <mutex>

#include "ops/cuda/cublas_api.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernels.h"

namespace cnnflow {

namespace detail {
const char* CublasStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
    default:
      return "unknown cuBLAS status";
  }
}
}  // namespace detail

CudaContext& CudaContext::Get(int device) {
  static std::mutex mu;
  // Never destroyed: handles outliving static destruction order is harmless,
  // destroying them after the driver has unloaded is not. By (GPU, lane).
  static auto* contexts = new std::map<std::pair<int, int>, std::unique_ptr<CudaContext>>();
  std::lock_guard<std::mutex> lock(mu);
  const int lane = CurrentGpuLane();
  auto& c = (*contexts)[{device, lane}];
  if (!c) {
    CNNFLOW_ENFORCE(device >= 0 && device < CudaDeviceCount(), "no device cuda:", device, " (",
                    CudaDeviceCount(), " GPUs found)");
    c.reset(new CudaContext(device, lane));
  }
  return *c;
}

CudaContext& CudaContext::For(Device device) {
  CNNFLOW_ENFORCE(device.is_cuda(), "a CUDA kernel was given a tensor on ", device.ToString());
  CudaContext& c = Get(device.index);
  c.Activate();
  return c;
}

CudaContext::CudaContext(int device, int lane) : device_(device), lane_(lane) {
  CNNFLOW_CUDA_CHECK(cudaSetDevice(device));
  CNNFLOW_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CNNFLOW_CUDNN_CHECK(cudnnCreate(&cudnn_));
  CNNFLOW_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
}

CudaContext::~CudaContext() {
  cudaSetDevice(device_);
  if (cublas_) detail::Cublas().Destroy(cublas_);
  if (cudnn_) cudnnDestroy(cudnn_);
  if (stream_) cudaStreamDestroy(stream_);
}

cublasHandle_t CudaContext::cublas() {
  std::lock_guard<std::mutex> lock(cublas_mu_);
  if (cublas_ == nullptr) {
    Activate();
    cublasHandle_t h = nullptr;
    CNNFLOW_CUBLAS_CHECK(detail::Cublas().Create(&h));
    CNNFLOW_CUBLAS_CHECK(detail::Cublas().SetStream(h, stream_));
    // fp32 GEMMs stay fp32 (no TF32), as PyTorch's default for matmuls
    // (torch.backends.cuda.matmul.allow_tf32 = False), whatever graph.tf32
    // says (it is cuDNN's switch, torch.backends.cudnn.allow_tf32). The
    // handle is used on its one stream only, so its results are the same
    // bits every run (cuBLAS's reproducibility rule): graph.deterministic
    // asks nothing more of it.
    CNNFLOW_CUBLAS_CHECK(detail::Cublas().SetMathMode(h, CUBLAS_DEFAULT_MATH));
    cublas_ = h;
  }
  return cublas_;
}

void* CudaContext::Workspace(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (!workspace_ || workspace_->bytes() < bytes) {
    // The old block may still be in use by issued work: the pool hands it
    // out again only to later work on this same stream (see the header).
    workspace_.reset();
    workspace_ = std::make_unique<Storage>(Device::Cuda(device_), bytes);
  }
  return workspace_->data();
}

void CudaContext::SetMath(const GpuMathOptions& math) {
  std::lock_guard<std::mutex> lock(math_mu_);
  math_ = math;
}

GpuMathOptions CudaContext::math() const {
  std::lock_guard<std::mutex> lock(math_mu_);
  return math_;
}

namespace cuda {
void SetMath(Device device, const GpuMathOptions& math) { CudaContext::For(device).SetMath(math); }
void Synchronize(Device device) { CudaContext::For(device).Synchronize(); }
}  // namespace cuda

void CudaContext::Activate() const { CNNFLOW_CUDA_CHECK(cudaSetDevice(device_)); }

void CudaContext::Synchronize() const { CNNFLOW_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

}  // namespace cnnflow
