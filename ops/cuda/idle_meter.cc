// IdleMeter (ops/cuda/kernels.h): the idle gaps of a GPU's compute stream
// between steps, timed on the GPU with event pairs.
#include <deque>

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernels.h"

namespace cnnflow::cuda {

// Gaps as event pairs; events are recycled once both ends have completed.
struct IdleMeter::Impl {
  Device device;
  cudaEvent_t open = nullptr;  // EndOfWork without its StartOfWork yet
  std::deque<std::pair<cudaEvent_t, cudaEvent_t>> pending;
  std::vector<cudaEvent_t> spare;
  double idle = 0;

  cudaEvent_t Record() {
    // First: an event belongs to the device current when it is created, and
    // this thread may have driven another GPU last.
    const cudaStream_t stream = CudaContext::For(device).stream();
    cudaEvent_t e = nullptr;
    if (!spare.empty()) {
      e = spare.back();
      spare.pop_back();
    } else {
      CNNFLOW_CUDA_CHECK(cudaEventCreate(&e));  // with timing
    }
    CNNFLOW_CUDA_CHECK(cudaEventRecord(e, stream));
    return e;
  }
  void Collect() {
    while (!pending.empty() && cudaEventQuery(pending.front().second) == cudaSuccess) {
      float ms = 0;
      CNNFLOW_CUDA_CHECK(cudaEventElapsedTime(&ms, pending.front().first, pending.front().second));
      idle += ms / 1000.0;
      spare.push_back(pending.front().first);
      spare.push_back(pending.front().second);
      pending.pop_front();
    }
    (void)cudaGetLastError();  // cudaErrorNotReady from the query is not an error
  }
};

IdleMeter::IdleMeter(Device device) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  CudaContext::For(device);
}

IdleMeter::~IdleMeter() {
  cudaSetDevice(impl_->device.index);
  for (auto& [a, b] : impl_->pending) {
    cudaEventSynchronize(b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  if (impl_->open) {
    cudaEventSynchronize(impl_->open);
    cudaEventDestroy(impl_->open);
  }
  for (cudaEvent_t e : impl_->spare) cudaEventDestroy(e);
}

void IdleMeter::EndOfWork() {
  if (impl_->open) {  // two ends in a row: the later one counts
    CNNFLOW_CUDA_CHECK(cudaEventRecord(impl_->open, CudaContext::For(impl_->device).stream()));
    return;
  }
  impl_->open = impl_->Record();
}

void IdleMeter::StartOfWork() {
  if (!impl_->open) return;  // the first step: nothing before it
  impl_->pending.emplace_back(impl_->open, impl_->Record());
  impl_->open = nullptr;
  impl_->Collect();
}

double IdleMeter::idle_seconds() {
  impl_->Collect();
  return impl_->idle;
}

void IdleMeter::Reset() {
  impl_->Collect();
  impl_->idle = 0;
}

}  // namespace cnnflow::cuda
