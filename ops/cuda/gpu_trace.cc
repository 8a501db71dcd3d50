// GPU spans of the profiler (ops/cuda/kernels.h GpuSpan): CUDA event pairs
// kept until the trace is read, then turned into spans of the lane
// "cuda:K" on the host's clock. Nothing here throws: a failed CUDA call
// loses its span, never the run.
#include <map>
#include <mutex>
#include <vector>

#include "ops/cuda/context.h"
#include "ops/cuda/kernels.h"
#include "ops/trace.h"

namespace cnnflow::cuda {

namespace {

struct Pending {
  int device;
  uint32_t session;
  const char* category;
  std::string name;
  cudaEvent_t begin, end;
};

// Where a trace's GPU clock starts on a device: an event the host waited
// for, and the host time right after.
struct Reference {
  uint32_t session = 0;
  cudaEvent_t event = nullptr;
  int64_t host_ns = 0;
};

struct State {
  std::mutex mu;
  std::vector<Pending> pending;
  std::map<int, std::vector<cudaEvent_t>> spare;  // events belong to their device
  std::map<int, Reference> refs;
};

State& St() {
  static State* s = new State();  // never destroyed: spans may end at exit
  return *s;
}

cudaEvent_t TakeEvent(int device) {
  State& s = St();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto& list = s.spare[device];
    if (!list.empty()) {
      cudaEvent_t e = list.back();
      list.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  if (cudaEventCreate(&e) != cudaSuccess) {  // with timing
    (void)cudaGetLastError();
    return nullptr;
  }
  return e;
}

void Flush() {
  State& s = St();
  std::vector<Pending> todo;
  std::map<int, Reference> refs;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    todo.swap(s.pending);
    refs = s.refs;
  }
  for (Pending& p : todo) {
    const Reference& ref = refs[p.device];
    float b = 0, e = 0;
    if (ref.session == p.session && cudaSetDevice(p.device) == cudaSuccess &&
        cudaEventSynchronize(p.end) == cudaSuccess &&
        cudaEventElapsedTime(&b, ref.event, p.begin) == cudaSuccess &&
        cudaEventElapsedTime(&e, ref.event, p.end) == cudaSuccess) {
      Tracer::RecordOn(StrCat("cuda:", p.device), p.session, p.category, std::move(p.name),
                       ref.host_ns + static_cast<int64_t>(static_cast<double>(b) * 1e6),
                       ref.host_ns + static_cast<int64_t>(static_cast<double>(e) * 1e6));
    }
    (void)cudaGetLastError();
    std::lock_guard<std::mutex> lock(s.mu);
    s.spare[p.device].push_back(p.begin);
    s.spare[p.device].push_back(p.end);
  }
}

}  // namespace

GpuSpan::GpuSpan(Device device, const char* category, std::string name)
    : device_(device.index),
      category_(category),
      name_(std::move(name)),
      session_(Tracer::session()) {
  if (session_ == 0) return;
  static const bool registered = (Tracer::AddFlusher(&Flush), true);
  (void)registered;
  CudaContext& ctx = CudaContext::For(device);
  State& s = St();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    Reference& ref = s.refs[device_];
    if (ref.session != session_) {  // the first span of this trace on this GPU
      if (ref.event == nullptr && cudaEventCreate(&ref.event) != cudaSuccess) ref.event = nullptr;
      if (ref.event != nullptr && cudaEventRecord(ref.event, ctx.stream()) == cudaSuccess &&
          cudaEventSynchronize(ref.event) == cudaSuccess) {
        ref.host_ns = Tracer::NowNs();
        ref.session = session_;
      }
      (void)cudaGetLastError();
    }
  }
  begin_ = TakeEvent(device_);
  if (begin_ != nullptr &&
      cudaEventRecord(static_cast<cudaEvent_t>(begin_), ctx.stream()) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

GpuSpan::~GpuSpan() {
  if (session_ == 0 || begin_ == nullptr) return;
  try {
    cudaEvent_t end = TakeEvent(device_);
    if (end == nullptr) return;
    if (cudaSetDevice(device_) != cudaSuccess ||
        cudaEventRecord(end, CudaContext::Get(device_).stream()) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    State& s = St();
    std::lock_guard<std::mutex> lock(s.mu);
    s.pending.push_back(Pending{device_, session_, category_, std::move(name_),
                                static_cast<cudaEvent_t>(begin_), end});
  } catch (...) {  // a lost span, never a lost run
  }
}

}  // namespace cnnflow::cuda
