// NCCL collectives among the GPU replicas of a job (see ops/cuda/nccl_comm.h):
// non-blocking communicators, event ordering against each replica's compute
// stream, and host waits polled against a deadline so a hang becomes an error.
#include "ops/cuda/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include "ops/collectives/collective_mpi.h"
#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/lane_group.h"
#include "ops/device.h"
#include "ops/tensor.h"

namespace cnnflow {
namespace {

using Clock = std::chrono::steady_clock;

static_assert(sizeof(ncclUniqueId) == sizeof(NcclGroup::UniqueId),
              "NcclGroup::UniqueId must hold an ncclUniqueId");

// Polling: spin briefly (a collective often ends within it), then sleep
// between polls so a waiting thread leaves the cores to the replicas.
constexpr auto kBusyPoll = std::chrono::microseconds(500);
constexpr auto kPollSleep = std::chrono::microseconds(50);

void PollPause(Clock::time_point start) {
  if (Clock::now() - start < kBusyPoll) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(kPollSleep);
  }
}

// "ncclRemoteError (remote process exited or there was a network error):
// <NCCL's last message>".
std::string NcclMessage(ncclResult_t res, ncclComm_t comm) {
  std::string s = ncclGetErrorString(res);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') s += StrCat(" (", last, ")");
  return s;
}

}  // namespace

// One collective issued on a replica's NCCL stream and not yet seen done.
struct NcclGroup::Pending {
  cudaEvent_t done = nullptr;  // recorded on the NCCL stream after it
  const char* op = "";
  std::string tag;
  int64_t count = 0;
  Clock::time_point issued;
};

// Per replica: its communicator, NCCL stream and events. The pending list
// and event pool are touched only by the replica's own (calling) thread;
// `comm` is guarded by `mu` because Break() may abort it from any thread.
struct NcclGroup::Replica {
  int device = 0;
  int global_rank = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;  // compute stream -> NCCL stream
  std::deque<Pending> pending;
  std::vector<cudaEvent_t> free_events;
  std::mutex mu;
  ncclComm_t comm = nullptr;  // guarded by mu

  ~Replica() {
    // Best effort: nothing here may throw.
    cudaSetDevice(device);
    if (comm != nullptr) ncclCommAbort(comm);
    for (Pending& p : pending) cudaEventDestroy(p.done);
    for (cudaEvent_t e : free_events) cudaEventDestroy(e);
    if (ready != nullptr) cudaEventDestroy(ready);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  cudaEvent_t TakeEvent() {
    if (!free_events.empty()) {
      cudaEvent_t e = free_events.back();
      free_events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    CNNFLOW_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
};

NcclGroup::UniqueId NcclGroup::NewUniqueId() {
  ncclUniqueId id;
  const ncclResult_t res = ncclGetUniqueId(&id);
  if (res != ncclSuccess) {
    throw Error(StrCat("ncclGetUniqueId failed: ", ncclGetErrorString(res),
                       " (NCCL could not set up its bootstrap network; see NCCL_SOCKET_IFNAME)"));
  }
  UniqueId out;
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

NcclGroup::NcclGroup(const std::vector<int>& devices, MpiWorld& world, double timeout_s)
    : devices_(devices), timeout_s_(timeout_s) {
  // Checked before any collective, so a bad list fails at once here; the
  // other processes then fail in the gather below, within the timeout.
  CheckNcclDevices(devices_);
  CNNFLOW_ENFORCE(timeout_s > 0, "NCCL group: timeout must be positive, got ", timeout_s, " s");
  const bool multi = world.active() && world.size() > 1;
  if (multi) world_where_ = world.Where() + ": ";
  // Inactive world: AllGather returns our own count, BroadcastBytes is a no-op.
  const std::vector<uint64_t> counts =
      world.AllGather(devices_.size(), "GPU replica counts (NCCL group)", timeout_s);
  layout_ = ComputeNcclLayout(counts, multi ? world.rank() : 0);
  use_nccl_ = layout_.global_size > 1;
  UniqueId id{};
  if (use_nccl_) {
    // Global rank 0 is process 0's replica 0 (every process has one or more).
    if (!multi || world.rank() == 0) id = NewUniqueId();
    if (multi)
      world.BroadcastBytes(id.data(), static_cast<int64_t>(id.size()), 0, "NCCL unique id",
                           timeout_s);
  }
  Init(use_nccl_ ? &id : nullptr);
}

NcclGroup::NcclGroup(const std::vector<int>& devices, int global_size, int global_offset,
                     const UniqueId& id, double timeout_s)
    : devices_(devices), timeout_s_(timeout_s) {
  CheckNcclDevices(devices_);
  CNNFLOW_ENFORCE(timeout_s > 0, "NCCL group: timeout must be positive, got ", timeout_s, " s");
  if (global_offset < 0 || global_size < 1 ||
      global_offset + static_cast<int>(devices_.size()) > global_size) {
    throw Error(StrCat("NCCL group: replicas ", global_offset, "..",
                       global_offset + static_cast<int>(devices_.size()) - 1,
                       " do not fit in a group of ", global_size));
  }
  layout_.global_size = global_size;
  layout_.global_offset = global_offset;
  use_nccl_ = true;
  Init(&id);
}

void NcclGroup::Init(const UniqueId* id) {
  MakeReplicas();
  if (!use_nccl_) return;
  const std::string what = StrCat(world_where_, "NCCL start-up of ",
                                  DescribeNcclDevices(devices_, layout_.global_offset),
                                  " in a group of ", layout_.global_size, " GPU replicas");
  StartCommunicators(*id, what);
  AwaitCommunicators(what);
}

void NcclGroup::MakeReplicas() {
  const int count = CudaDeviceCount();
  for (size_t r = 0; r < devices_.size(); ++r) {
    if (devices_[r] >= count) {
      throw Error(StrCat(world_where_, "NCCL group: replica ", r, " is on cuda:", devices_[r],
                         " but this machine has ", count, " GPUs"));
    }
  }
  for (size_t r = 0; r < devices_.size(); ++r) {
    auto rep = std::make_unique<Replica>();
    rep->device = devices_[r];
    rep->global_rank = layout_.global_offset + static_cast<int>(r);
    CudaContext::Get(rep->device).Activate();  // makes the compute stream too
    // The highest priority: gradient buckets are reduced while backward goes
    // on, and a bucket waiting behind backward's kernels delays the step.
    int least = 0, greatest = 0;
    CNNFLOW_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CNNFLOW_CUDA_CHECK(cudaStreamCreateWithPriority(&rep->stream, cudaStreamNonBlocking, greatest));
    CNNFLOW_CUDA_CHECK(cudaEventCreateWithFlags(&rep->ready, cudaEventDisableTiming));
    replicas_.push_back(std::move(rep));
  }
}

void NcclGroup::AbortCommunicators() {
  for (auto& rep : replicas_) {
    std::lock_guard<std::mutex> lock(rep->mu);
    if (rep->comm != nullptr) {
      cudaSetDevice(rep->device);
      ncclCommAbort(rep->comm);
      rep->comm = nullptr;
    }
  }
}

void NcclGroup::StartCommunicators(const UniqueId& id, const std::string& what) {
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof(uid));
  // Non-blocking: no NCCL call waits for peers on the host, so a process that
  // never comes turns into a timeout here instead of a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  std::string failure;
  ncclResult_t res = ncclGroupStart();
  if (res != ncclSuccess)
    throw Error(StrCat(what, ": ncclGroupStart failed: ", ncclGetErrorString(res)));
  for (auto& rep : replicas_) {
    CNNFLOW_CUDA_CHECK(cudaSetDevice(rep->device));
    res = ncclCommInitRankConfig(&rep->comm, layout_.global_size, uid, rep->global_rank, &config);
    if (res != ncclSuccess && res != ncclInProgress && failure.empty()) {
      failure = StrCat("ncclCommInitRankConfig for cuda:", rep->device,
                       " failed: ", NcclMessage(res, rep->comm));
    }
  }
  res = ncclGroupEnd();
  if (res != ncclSuccess && res != ncclInProgress && failure.empty()) {
    failure = StrCat("ncclGroupEnd failed: ", NcclMessage(res, nullptr));
  }
  if (!failure.empty()) {
    AbortCommunicators();
    throw Error(StrCat(what, " failed: ", failure,
                       " (a GPU used twice, also by two processes on one node, or a bad "
                       "NCCL setting)"));
  }
}

void NcclGroup::AwaitCommunicators(const std::string& what) {
  // Bounded (at start-up: graph.startup_timeout_s).
  const auto start = Clock::now();
  const MpiWorld::WaitLimit limit = MpiWorld::LimitFor(timeout_s_);
  const auto deadline = DeadlineIn(limit.seconds);
  for (;;) {
    std::string failure;
    bool in_progress = false;
    for (auto& rep : replicas_) {
      ncclResult_t state = ncclInProgress;
      if (rep->comm == nullptr) {
        failure = StrCat("no communicator was made for cuda:", rep->device);
        break;
      }
      const ncclResult_t res = ncclCommGetAsyncError(rep->comm, &state);
      if (res != ncclSuccess) state = res;
      if (state == ncclInProgress) {
        in_progress = true;
      } else if (state != ncclSuccess) {
        failure = StrCat("communicator of cuda:", rep->device,
                         " failed: ", NcclMessage(state, rep->comm));
        break;
      }
    }
    if (!failure.empty()) {
      AbortCommunicators();
      throw CollectiveAborted(StrCat(what, " failed: ", failure));
    }
    if (!in_progress) break;
    if (Clock::now() >= deadline) {
      AbortCommunicators();
      throw CollectiveTimeout(
          StrCat(what, " did not complete within ", limit.Text(),
                 ": a process of the job did not start or died, or the processes disagree on the "
                 "number of GPU replicas"));
    }
    PollPause(start);
  }
}

NcclGroup::~NcclGroup() {
  // Best effort and bounded: issued collectives finish, then the
  // communicators are finalized and destroyed; anything that does not end in
  // time (or a broken group) is aborted instead. Nothing here throws.
  if (use_nccl_ && !broken()) {
    bool ok = true;
    for (auto& rep : replicas_) {
      std::lock_guard<std::mutex> lock(rep->mu);
      if (rep->comm == nullptr) continue;
      cudaSetDevice(rep->device);
      const ncclResult_t res = ncclCommFinalize(rep->comm);
      if (res != ncclSuccess && res != ncclInProgress) ok = false;
    }
    const auto start = Clock::now();
    const auto deadline = DeadlineIn(timeout_s_);
    while (ok) {
      bool in_progress = false;
      for (auto& rep : replicas_) {
        std::lock_guard<std::mutex> lock(rep->mu);
        if (rep->comm == nullptr) continue;
        ncclResult_t state = ncclInProgress;
        if (ncclCommGetAsyncError(rep->comm, &state) != ncclSuccess) state = ncclInternalError;
        if (state == ncclInProgress) in_progress = true;
        if (state != ncclSuccess && state != ncclInProgress) ok = false;
      }
      if (!in_progress) break;
      if (Clock::now() >= deadline) ok = false;
      if (ok) PollPause(start);
    }
    for (auto& rep : replicas_) {
      std::lock_guard<std::mutex> lock(rep->mu);
      if (rep->comm == nullptr) continue;
      cudaSetDevice(rep->device);
      if (ok) {
        ncclCommDestroy(rep->comm);
      } else {
        ncclCommAbort(rep->comm);
      }
      rep->comm = nullptr;
    }
  }
  // Aborts what is left; frees streams and events (Replica's destructor).
  replicas_.clear();
}

int NcclGroup::device(int r) const {
  CheckReplica(r, "device");
  return devices_[r];
}

std::string NcclGroup::broken_reason() const {
  std::lock_guard<std::mutex> lock(broken_mu_);
  return broken_reason_;
}

std::string NcclGroup::Where(int r) const {
  return StrCat(world_where_, "replica ", r, " (global rank ", layout_.global_offset + r,
                ", cuda:", devices_[r], "): ");
}

void NcclGroup::CheckReplica(int r, const char* op) const {
  if (r < 0 || r >= size()) {
    throw Error(StrCat(world_where_, "NCCL ", op, ": replica ", r,
                       " out of range (this process has ", size(), ")"));
  }
}

void NcclGroup::ThrowBroken(int r, const char* op, const std::string& tag) const {
  bool timeout = false;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(broken_mu_);
    timeout = broken_by_timeout_;
    reason = broken_reason_;
  }
  const std::string msg = StrCat(Where(r), "NCCL ", op, tag.empty() ? "" : " '", tag,
                                 tag.empty() ? "" : "'", " failed, the group is broken: ", reason);
  if (timeout) throw CollectiveTimeout(msg);
  throw CollectiveAborted(msg);
}

void NcclGroup::Break(bool timeout, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(broken_mu_);
    if (!broken_.load(std::memory_order_relaxed)) {
      broken_reason_ = reason;
      broken_by_timeout_ = timeout;
      broken_.store(true, std::memory_order_release);
    }
  }
  // Aborting ends NCCL kernels stuck on the GPU waiting for a peer, so the
  // NCCL streams drain and no replica stays blocked. The calling thread (any
  // replica's) keeps its current device.
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) current = -1;
  AbortCommunicators();
  if (current >= 0) cudaSetDevice(current);
}

void NcclGroup::Abort(const std::string& reason) { Break(false, reason); }

void NcclGroup::BreakOn(bool timeout, int r, const char* op, const std::string& tag, int64_t count,
                        const std::string& what) {
  const std::string msg = StrCat(Where(r), "NCCL ", op, " '", tag, "' (", count, " floats", what,
                                 "; every communicator of the group was aborted");
  Break(timeout, msg);
  if (timeout) throw CollectiveTimeout(msg);
  throw CollectiveAborted(msg);
}

void NcclGroup::AllReduceSum(int r, float* data, int64_t count, const std::string& tag,
                             float scale) {
  Enqueue(r, "AllReduceSum", data, count, -1, scale, tag);
}

void NcclGroup::Broadcast(int r, float* data, int64_t count, int root_global_rank,
                          const std::string& tag) {
  if (root_global_rank < 0 || root_global_rank >= layout_.global_size) {
    CheckReplica(r, "Broadcast");
    throw Error(StrCat(Where(r), "NCCL Broadcast '", tag, "': root ", root_global_rank,
                       " is not a global rank of the group (0..", layout_.global_size - 1, ")"));
  }
  Enqueue(r, "Broadcast", data, count, root_global_rank, 1.0f, tag);
}

void NcclGroup::Barrier(int r, const std::string& tag) {
  CheckReplica(r, "Barrier");
  Tensor one = Tensor::Zeros(Shape({1}), DType::kF32, Device::Cuda(devices_[r]));
  AllReduceSum(r, one.data<float>(), 1, tag);
  Wait(r);  // before `one` goes back to the pool
}

// A collective handed to NCCL and not yet launched: when, and the
// pre-multiplied sum operator made for it (destroyed once launched).
struct NcclGroup::Issued {
  Clock::time_point at;
  ncclRedOp_t premul = ncclSum;
  bool has_premul = false;
};

void NcclGroup::Enqueue(int r, const char* op, float* data, int64_t count, int root, float scale,
                        const std::string& tag) {
  CheckReplica(r, op);
  if (broken()) ThrowBroken(r, op, tag);
  if (count < 0 || (count > 0 && data == nullptr)) {
    throw Error(StrCat(Where(r), "NCCL ", op, " '", tag, "': bad buffer (", count, " floats at ",
                       static_cast<void*>(data), ")"));
  }
  if (count == 0) return;
  const bool broadcast = root >= 0;
  // One replica in the job: the sum is the data itself, nothing to order.
  if (!use_nccl_ && (broadcast || scale == 1.0f)) return;

  Replica& rep = *replicas_[r];
  CudaContext& ctx = CudaContext::Get(rep.device);
  ctx.Activate();
  CheckDeviceBuffer(r, op, data, count, tag);
  // What the compute stream has been given so far comes first.
  CNNFLOW_CUDA_CHECK(cudaEventRecord(rep.ready, ctx.stream()));
  CNNFLOW_CUDA_CHECK(cudaStreamWaitEvent(rep.stream, rep.ready, 0));

  if (!use_nccl_) {
    if (scale != 1.0f) {
      cuda::ScaleFloats(data, count, scale, rep.stream);
      CNNFLOW_CUDA_CHECK_LAUNCH();
    }
  } else {
    Issued issued;
    issued.at = Clock::now();
    std::string failure = Launch(r, op, data, count, root, scale, tag, &issued);
    if (failure.empty()) failure = AwaitLaunch(r, op, count, tag, issued);
    if (!failure.empty()) {
      BreakOn(
          false, r, op, tag, count,
          StrCat(broadcast ? StrCat(" from global rank ", root) : std::string(), "): ", failure));
    }
  }
  PushPending(r, op, count, tag);
}

void NcclGroup::CheckDeviceBuffer(int r, const char* op, float* data, int64_t count,
                                  const std::string& tag) const {
  const int device = replicas_[r]->device;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, data) != cudaSuccess ||
      (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) ||
      (attr.type == cudaMemoryTypeDevice && attr.device != device)) {
    cudaGetLastError();  // a failed query leaves its error behind: clear it
    throw Error(StrCat(Where(r), "NCCL ", op, " '", tag, "': the buffer (", count, " floats at ",
                       static_cast<void*>(data), ") is not GPU memory of cuda:", device,
                       attr.type == cudaMemoryTypeDevice
                           ? StrCat(" (it is on cuda:", attr.device, ")")
                           : std::string(" (host memory?)")));
  }
}

std::string NcclGroup::Launch(int r, const char* op, float* data, int64_t count, int root,
                              float scale, const std::string& tag, Issued* issued) {
  Replica& rep = *replicas_[r];
  std::lock_guard<std::mutex> lock(rep.mu);
  if (rep.comm == nullptr) ThrowBroken(r, op, tag);
  ncclResult_t res = ncclSuccess;
  if (root >= 0) {
    res = ncclBroadcast(data, data, static_cast<size_t>(count), ncclFloat32, root, rep.comm,
                        rep.stream);
  } else if (scale == 1.0f) {
    res = ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum, rep.comm,
                        rep.stream);
  } else {
    // sum(scale * x_i): one pass, no extra kernel. The scalar is read
    // when the operator is made (host-immediate).
    res = ncclRedOpCreatePreMulSum(&issued->premul, &scale, ncclFloat32, ncclScalarHostImmediate,
                                   rep.comm);
    if (res != ncclSuccess) {
      return StrCat("ncclRedOpCreatePreMulSum(", scale, ") failed: ", NcclMessage(res, rep.comm));
    }
    issued->has_premul = true;
    res = ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat32, issued->premul,
                        rep.comm, rep.stream);
  }
  if (res != ncclSuccess && res != ncclInProgress) {
    return StrCat("the NCCL call failed: ", NcclMessage(res, rep.comm));
  }
  return "";
}

std::string NcclGroup::AwaitLaunch(int r, const char* op, int64_t count, const std::string& tag,
                                   const Issued& issued) {
  Replica& rep = *replicas_[r];
  // A non-blocking communicator may still be launching (e.g. connecting to
  // its peers on first use); the kernels are on the stream only once its
  // state is ncclSuccess, and no other call may be made on it before.
  const MpiWorld::WaitLimit limit = MpiWorld::LimitFor(timeout_s_);
  for (const auto start = Clock::now();;) {
    ncclResult_t state = ncclInProgress;
    {
      std::lock_guard<std::mutex> lock(rep.mu);
      if (rep.comm == nullptr) ThrowBroken(r, op, tag);
      const ncclResult_t res = ncclCommGetAsyncError(rep.comm, &state);
      if (res != ncclSuccess) state = res;
      if (state != ncclSuccess && state != ncclInProgress) {
        return StrCat("NCCL reported: ", NcclMessage(state, rep.comm));
      }
    }
    if (state == ncclSuccess) {
      // The operator may go once the call that used it has returned and
      // the communicator is ready for the next call. (If it fails, the
      // abort frees it with the communicator.)
      std::lock_guard<std::mutex> lock(rep.mu);
      if (issued.has_premul && rep.comm != nullptr) ncclRedOpDestroy(issued.premul, rep.comm);
      return "";
    }
    if (Clock::now() - issued.at >= std::chrono::duration<double>(limit.seconds)) {
      BreakOn(true, r, op, tag, count,
              StrCat(") could not be started within ", limit.Text(),
                     ": a peer replica or process never joined it"));
    }
    PollPause(start);
  }
}

void NcclGroup::PushPending(int r, const char* op, int64_t count, const std::string& tag) {
  Replica& rep = *replicas_[r];
  Pending p;
  p.done = rep.TakeEvent();
  p.op = op;
  p.tag = tag;
  p.count = count;
  p.issued = Clock::now();
  const cudaError_t err = cudaEventRecord(p.done, rep.stream);
  if (err != cudaSuccess) {
    cudaEventDestroy(p.done);
    throw Error(StrCat(Where(r), "cudaEventRecord after NCCL ", op, " '", tag,
                       "' failed: ", cudaGetErrorString(err)));
  }
  rep.pending.push_back(std::move(p));
}

void NcclGroup::Wait(int r) {
  CheckReplica(r, "Wait");
  Replica& rep = *replicas_[r];
  if (broken()) ThrowBroken(r, "Wait", rep.pending.empty() ? "" : rep.pending.front().tag);
  if (rep.pending.empty()) return;
  CudaContext& ctx = CudaContext::Get(rep.device);
  ctx.Activate();
  // The NCCL stream runs in order: its last event covers every collective.
  CNNFLOW_CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), rep.pending.back().done, 0));

  const auto start = Clock::now();
  const MpiWorld::WaitLimit limit = MpiWorld::LimitFor(timeout_s_);
  while (!rep.pending.empty()) {
    Pending& p = rep.pending.front();
    if (broken()) ThrowBroken(r, p.op, p.tag);
    const cudaError_t q = cudaEventQuery(p.done);
    if (q == cudaSuccess) {
      rep.free_events.push_back(p.done);
      rep.pending.pop_front();
      continue;
    }
    if (q != cudaErrorNotReady) {
      const std::string msg = StrCat(Where(r), "NCCL ", p.op, " '", p.tag, "' (", p.count,
                                     " floats) failed on the GPU: ", cudaGetErrorString(q));
      Break(false, msg);
      throw CollectiveAborted(msg);
    }
    if (use_nccl_) {
      std::string failure;
      {
        std::lock_guard<std::mutex> lock(rep.mu);
        if (rep.comm == nullptr) ThrowBroken(r, p.op, p.tag);
        ncclResult_t state = ncclSuccess;
        const ncclResult_t res = ncclCommGetAsyncError(rep.comm, &state);
        if (res != ncclSuccess) state = res;
        if (state != ncclSuccess && state != ncclInProgress) {
          failure = NcclMessage(state, rep.comm);
        }
      }
      if (!failure.empty()) BreakOn(false, r, p.op, p.tag, p.count, StrCat(") failed: ", failure));
    }
    const double waited = std::chrono::duration<double>(Clock::now() - p.issued).count();
    if (waited >= limit.seconds) {
      BreakOn(true, r, p.op, p.tag, p.count,
              StrCat(") did not complete within ", limit.Text(),
                     " of being issued: a peer replica or process died, stalled or issued a "
                     "different collective"));
    }
    PollPause(start);
  }
}

std::unique_ptr<Collective> MakeGpuCollective(const std::vector<int>& devices, MpiWorld& world,
                                              double timeout_s) {
  // One GPU listed several times: NCCL cannot hold it twice; its replicas
  // reduce on the device, each in its lane (ops/cuda/lane_group.h).
  const bool repeats = std::any_of(devices.begin(), devices.end(), [&](int d) {
    return std::count(devices.begin(), devices.end(), d) > 1;
  });
  if (repeats) {
    const bool one_gpu =
        std::all_of(devices.begin(), devices.end(), [&](int d) { return d == devices[0]; });
    if (!one_gpu || world.active()) {
      throw ConfigError(
          StrCat("graph.devices: a GPU listed more than once runs its replicas in "
                 "one process, with no other GPU, so far (got ",
                 devices.size(), " devices", world.active() ? ", under mpirun" : "", ")"));
    }
    return MakeLaneGroup(devices[0], static_cast<int>(devices.size()), timeout_s);
  }
  return std::make_unique<NcclGroup>(devices, world, timeout_s);
}

}  // namespace cnnflow
