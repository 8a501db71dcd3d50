// IdleMeter (ops/cuda/kernels.h): a GPU compute stream's time between
// steps (idle) and within them (the phases), timed on the GPU: an event at
// each boundary, the span between two consecutive ones counted to what ran
// in it.
#include <array>
#include <deque>

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernels.h"

namespace cnnflow::cuda {
namespace {
constexpr int kIdle = -1;  // between EndOfWork and StartOfWork
}  // namespace

// Spans as consecutive boundary events; an event is recycled once the span
// it begins has been counted (the one it ends was counted before).
struct IdleMeter::Impl {
  Device device;
  cudaEvent_t last = nullptr;  // the latest boundary
  int phase = kIdle;           // what runs since `last`
  struct Span {
    cudaEvent_t begin, end;
    int phase;
  };
  std::deque<Span> pending;
  std::vector<cudaEvent_t> spare;
  double idle = 0;
  std::array<double, kGpuPhases> busy{};

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
  // A boundary now: the span since `last` is closed, `next` runs from here.
  void Boundary(int next) {
    cudaEvent_t e = Record();
    if (last != nullptr) pending.push_back({last, e, phase});
    last = e;
    phase = next;
  }
  void Collect() {
    while (!pending.empty() && cudaEventQuery(pending.front().end) == cudaSuccess) {
      const Span s = pending.front();
      float ms = 0;
      CNNFLOW_CUDA_CHECK(cudaEventElapsedTime(&ms, s.begin, s.end));
      (s.phase == kIdle ? idle : busy[s.phase]) += ms / 1000.0;
      spare.push_back(s.begin);
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
  for (const Impl::Span& s : impl_->pending) {
    cudaEventSynchronize(s.end);
    cudaEventDestroy(s.begin);
  }
  if (impl_->last) {
    cudaEventSynchronize(impl_->last);
    cudaEventDestroy(impl_->last);
  }
  for (cudaEvent_t e : impl_->spare) cudaEventDestroy(e);
}

void IdleMeter::EndOfWork() {
  if (impl_->phase == kIdle && impl_->last != nullptr) {
    // Two ends in a row: the later one counts (the work between them was
    // the step's, on the span before).
    CNNFLOW_CUDA_CHECK(cudaEventRecord(impl_->last, CudaContext::For(impl_->device).stream()));
    return;
  }
  impl_->Boundary(kIdle);
}

void IdleMeter::StartOfWork() {
  impl_->Boundary(kGpuForward);
  impl_->Collect();
}

void IdleMeter::Mark(GpuPhase phase) { impl_->Boundary(phase); }

double IdleMeter::idle_seconds() {
  impl_->Collect();
  return impl_->idle;
}

double IdleMeter::busy_seconds(GpuPhase phase) {
  impl_->Collect();
  return impl_->busy[phase];
}

void IdleMeter::Reset() {
  impl_->Collect();
  impl_->idle = 0;
  impl_->busy.fill(0);
}

}  // namespace cnnflow::cuda
