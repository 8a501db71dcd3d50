#include "ops/cuda/lane_group.h"

#include <cuda_runtime.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/device.h"

namespace cnnflow {
namespace {

using cuda::kMaxLanes;

enum class Op { kSum, kBroadcast, kBarrier };

const char* OpName(Op op) {
  switch (op) {
    case Op::kSum:
      return "all-reduce";
    case Op::kBroadcast:
      return "broadcast";
    default:
      return "barrier";
  }
}

class LaneGroup final : public Collective {
 public:
  LaneGroup(int device, int lanes, double timeout_s, int first_lane)
      : device_(device),
        lanes_(lanes),
        first_lane_(first_lane),
        timeout_s_(timeout_s),
        next_(static_cast<size_t>(lanes), 0),
        pending_(static_cast<size_t>(lanes)) {
    CNNFLOW_ENFORCE(lanes >= 2 && lanes <= kMaxLanes, "cuda:", device, " listed ", lanes,
                    " times: from 2 to ", kMaxLanes, " replicas may share a GPU");
  }
  ~LaneGroup() override {
    for (auto& [k, c] : calls_) DestroyEvents(c);
  }

  int size() const override { return lanes_; }
  int global_size() const override { return lanes_; }
  int global_offset() const override { return 0; }
  double timeout_s() const override { return timeout_s_; }
  bool enqueues() const override { return true; }

  void AllReduceSum(int rank, float* data, int64_t count, const std::string& tag,
                    float scale) override {
    Arrive(rank, Op::kSum, data, count, tag, scale);
  }
  void Broadcast(int rank, float* data, int64_t count, const std::string& tag) override {
    Arrive(rank, Op::kBroadcast, data, count, tag, 1.0f);
  }
  void Barrier(int rank, const std::string& tag) override {
    const uint64_t k = Arrive(rank, Op::kBarrier, nullptr, 0, tag, 1.0f);
    std::unique_lock<std::mutex> lock(mu_);
    AwaitIssued(lock, calls_.at(k), DeadlineIn(timeout_s_));
  }
  void Wait(int rank) override;
  void Abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    BreakLocked(reason);
  }
  bool broken() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }

 private:
  struct Call {
    Op op = Op::kSum;
    std::string tag;
    int64_t count = 0;
    float scale = 1.0f;
    float* data[kMaxLanes] = {};
    std::vector<cudaEvent_t> ready;  // per member: its buffer is ready on its stream
    cudaEvent_t done = nullptr;      // the result is in every buffer
    int arrived = 0, waited = 0;
    bool issued = false;
  };

  // Member `rank` joins its next collective; the last to join issues it.
  uint64_t Arrive(int rank, Op op, float* data, int64_t count, const std::string& tag, float scale);
  // The kernel on the last member's stream, after every member's buffer.
  void Issue(Call& c, cudaStream_t stream);
  // Blocks until c is issued (or the group breaks, or the deadline passes).
  void AwaitIssued(std::unique_lock<std::mutex>& lock, const Call& c,
                   std::chrono::steady_clock::time_point deadline);
  void BreakLocked(const std::string& reason) {
    if (!broken_) {
      broken_ = true;
      reason_ = reason;
    }
    cv_.notify_all();
  }
  void ThrowIfBrokenLocked() const {
    if (broken_) {
      throw CollectiveAborted(
          StrCat("replicas on cuda:", device_, ": the group is broken: ", reason_));
    }
  }
  static void DestroyEvents(Call& c) {
    for (cudaEvent_t e : c.ready) {
      if (e) cudaEventDestroy(e);
    }
    if (c.done) cudaEventDestroy(c.done);
    c.ready.clear();
    c.done = nullptr;
  }

  const int device_, lanes_, first_lane_;
  const double timeout_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Call> calls_;              // by call number, until every member waited
  std::vector<uint64_t> next_;                  // per member: its next call's number
  std::vector<std::vector<uint64_t>> pending_;  // per member: calls it has not waited for
  bool broken_ = false;
  std::string reason_;
};

uint64_t LaneGroup::Arrive(int rank, Op op, float* data, int64_t count, const std::string& tag,
                           float scale) {
  CNNFLOW_ENFORCE(rank >= 0 && rank < lanes_, "replica ", rank, " of ", lanes_,
                  " on cuda:", device_);
  CNNFLOW_ENFORCE(CurrentGpuLane() == first_lane_ + rank, "'", tag, "': replica ", rank,
                  " on cuda:", device_, " called from GPU lane ", CurrentGpuLane(),
                  ", not its own (", first_lane_ + rank, ")");
  const cudaStream_t stream = CudaContext::For(Device::Cuda(device_)).stream();
  std::lock_guard<std::mutex> lock(mu_);
  ThrowIfBrokenLocked();
  const uint64_t k = next_[rank]++;
  Call& c = calls_[k];
  if (c.arrived == 0) {
    c.op = op;
    c.tag = tag;
    c.count = count;
    c.scale = scale;
    c.ready.assign(static_cast<size_t>(lanes_), nullptr);
  } else if (c.op != op || c.count != count || c.tag != tag) {
    const std::string why =
        StrCat("collective #", k, " differs between the replicas on cuda:", device_, ": ",
               OpName(c.op), " '", c.tag, "' of ", c.count, " values, and replica ", rank, "'s ",
               OpName(op), " '", tag, "' of ", count);
    BreakLocked(why);
    throw CollectiveAborted(why);
  }
  c.data[rank] = data;
  if (op != Op::kBarrier && count > 0) {
    CNNFLOW_CUDA_CHECK(cudaEventCreateWithFlags(&c.ready[rank], cudaEventDisableTiming));
    CNNFLOW_CUDA_CHECK(cudaEventRecord(c.ready[rank], stream));
  }
  pending_[rank].push_back(k);
  if (++c.arrived == lanes_) {
    Issue(c, stream);
    c.issued = true;
    cv_.notify_all();
  }
  return k;
}

void LaneGroup::Issue(Call& c, cudaStream_t stream) {
  if (c.op == Op::kBarrier || c.count == 0) return;
  for (cudaEvent_t e : c.ready) CNNFLOW_CUDA_CHECK(cudaStreamWaitEvent(stream, e, 0));
  if (c.op == Op::kSum) {
    cuda::LaneTreeSum(c.data, lanes_, c.count, c.scale, stream);
  } else {
    cuda::LaneBroadcast(c.data, lanes_, c.count, stream);
  }
  CNNFLOW_CUDA_CHECK(cudaEventCreateWithFlags(&c.done, cudaEventDisableTiming));
  CNNFLOW_CUDA_CHECK(cudaEventRecord(c.done, stream));
}

void LaneGroup::AwaitIssued(std::unique_lock<std::mutex>& lock, const Call& c,
                            std::chrono::steady_clock::time_point deadline) {
  if (!cv_.wait_until(lock, deadline, [&] { return c.issued || broken_; })) {
    const std::string why =
        StrCat(OpName(c.op), " '", c.tag, "' on cuda:", device_, ": ", c.arrived, " of ", lanes_,
               " replicas arrived within ", timeout_s_,
               " s (graph.collective_timeout_s): a replica failed, stalled or issued another "
               "collective");
    BreakLocked(why);
    throw CollectiveTimeout(why);
  }
  if (!c.issued) ThrowIfBrokenLocked();
}

void LaneGroup::Wait(int rank) {
  CNNFLOW_ENFORCE(CurrentGpuLane() == first_lane_ + rank, "replica ", rank, " on cuda:", device_,
                  " waits from GPU lane ", CurrentGpuLane(), ", not its own (", first_lane_ + rank,
                  ")");
  const cudaStream_t stream = CudaContext::For(Device::Cuda(device_)).stream();
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = DeadlineIn(timeout_s_);
  std::vector<uint64_t>& mine = pending_[rank];
  while (!mine.empty()) {
    const uint64_t k = mine.front();
    Call& c = calls_.at(k);
    AwaitIssued(lock, c, deadline);
    if (c.done) CNNFLOW_CUDA_CHECK(cudaStreamWaitEvent(stream, c.done, 0));
    mine.erase(mine.begin());
    if (++c.waited == lanes_) {
      DestroyEvents(c);  // safe while streams still wait on them: CUDA defers it
      calls_.erase(k);
    }
  }
}

}  // namespace

std::unique_ptr<Collective> MakeLaneGroup(int device, int lanes, double timeout_s, int first_lane) {
  return std::make_unique<LaneGroup>(device, lanes, timeout_s, first_lane);
}

}  // namespace cnnflow
