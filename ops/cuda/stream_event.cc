// StreamEvent (ops/stream_event.h) on a GPU: a cudaEvent_t without timing.
#include "ops/stream_event.h"

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"

namespace cnnflow {

StreamEvent::StreamEvent(Device device) : device_(device) {
  if (!device.is_cuda()) return;
  CudaContext& ctx = CudaContext::For(device);
  cudaEvent_t e = nullptr;
  CNNFLOW_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  event_ = e;
  CNNFLOW_CUDA_CHECK(cudaEventRecord(e, ctx.stream()));
}

StreamEvent::~StreamEvent() {
  if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

void StreamEvent::Await(Device waiter) const {
  if (event_ == nullptr) return;
  const auto e = static_cast<cudaEvent_t>(event_);
  if (!waiter.is_cuda()) {
    CNNFLOW_CUDA_CHECK(cudaEventSynchronize(e));
    return;
  }
  // A stream may wait for another GPU's event.
  CNNFLOW_CUDA_CHECK(cudaStreamWaitEvent(CudaContext::For(waiter).stream(), e, 0));
}

bool StreamEvent::passed() const {
  if (event_ == nullptr) return true;
  const cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (r == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error
    return false;
  }
  CNNFLOW_CUDA_CHECK(r);
  return true;
}

}  // namespace cnnflow
