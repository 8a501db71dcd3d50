// GpuGraph (ops/device_ops.h): stream capture of one lane's compute stream.
//
// The capture is thread-local (cudaStreamCaptureModeThreadLocal): the
// other lanes, the batch stager's copy stream and the loader threads go on
// while a step is captured; only the capturing thread may not make a call
// that could synchronise (a cudaMemcpy, an event query), which the captured
// step does not.
#include <cuda_runtime.h>

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/device_ops.h"

namespace cnnflow {

struct GpuGraph::Impl {
  Device device;
  cudaStream_t stream = nullptr;
  cudaGraphExec_t exec = nullptr;
};

GpuGraph::GpuGraph(Device device) : impl_(std::make_unique<Impl>()) {
  CNNFLOW_ENFORCE(device.is_cuda(), "a CUDA graph on ", device.ToString(), ": not a GPU");
  impl_->device = device;
  impl_->stream = CudaContext::For(device).stream();  // the calling thread's lane
}

GpuGraph::~GpuGraph() {
  if (impl_->exec == nullptr) return;
  cudaStreamSynchronize(impl_->stream);  // a replay may still run: errors are its caller's
  cudaGraphExecDestroy(impl_->exec);
}

void GpuGraph::Capture(const std::function<void()>& issue) {
  CNNFLOW_ENFORCE(impl_->exec == nullptr, "GpuGraph::Capture: captured already");
  CudaContext::For(impl_->device);  // the current device
  CNNFLOW_CUDA_CHECK(cudaStreamBeginCapture(impl_->stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    issue();
  } catch (...) {
    // Ends the capture that failed: the stream must leave capture mode.
    if (cudaStreamEndCapture(impl_->stream, &graph) == cudaSuccess && graph != nullptr)
      cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  const cudaError_t ended = cudaStreamEndCapture(impl_->stream, &graph);
  if (ended != cudaSuccess || graph == nullptr) {
    (void)cudaGetLastError();
    throw Error(StrCat("the work on ", impl_->device.ToString(),
                       " could not be captured as a CUDA graph: ", cudaGetErrorString(ended)));
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(StrCat("the CUDA graph captured on ", impl_->device.ToString(),
                       " could not be instantiated: ", cudaGetErrorString(made)));
  }
  impl_->exec = exec;
  CNNFLOW_CUDA_CHECK(cudaGraphUpload(exec, impl_->stream));  // the first replay's set-up, now
}

void GpuGraph::Replay() {
  CNNFLOW_ENFORCE(impl_->exec != nullptr, "GpuGraph::Replay before a capture");
  CNNFLOW_CUDA_CHECK(cudaGraphLaunch(impl_->exec, impl_->stream));
}

bool GpuGraph::captured() const { return impl_->exec != nullptr; }

}  // namespace cnnflow
