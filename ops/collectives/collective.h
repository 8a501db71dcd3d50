// In-process collectives: all-reduce, reduce, broadcast and barrier among N
// participants (CPU replicas) of one process, each calling from its own
// thread, over buffers in shared memory. Every collective has a timeout and
// can be aborted, so a replica that fails or stalls never leaves the others
// hanging. The cross-process layer (MPI) is in ops/collectives/collective_mpi.h.
//
// Matching: like MPI and NCCL, collectives are matched by call order. Every
// participant calls the same sequence of collectives on a group; the k-th
// call of rank 0 meets the k-th call of every other rank. Up to
// LocalGroup::kMaxInFlight collectives may be in flight at once (e.g. one
// bucket per thread while backward goes on); if a rank issues collectives
// from several threads, the order in which its calls *enter* the group is
// the matching order, so the caller must make that order the same on every
// rank. A mismatch (different operation, tag, size or root in the k-th call)
// is detected and fails every participant with a message naming both calls.
//
// Failure: after a timeout, an Abort() or a mismatch the group is broken:
// every participant waiting in it and every later call throws (a
// CollectiveTimeout or CollectiveAborted naming the collective, its tag and
// the cause). A collective whose participants have all arrived always runs
// to completion first, so no thread writes into a buffer whose owner has
// already returned. Make a new group to go on.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ops/collectives/reduction_tree.h"
#include "ops/error.h"

namespace cnnflow {

// The steady-clock time `seconds` from now: a collective's deadline.
inline std::chrono::steady_clock::time_point DeadlineIn(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(seconds));
}

// Base of the errors a collective throws.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

// A collective did not complete within its timeout (a participant died,
// stalled or called a different sequence of collectives).
class CollectiveTimeout : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

// The group was aborted (a participant failed and called Abort(), or the
// k-th calls of two participants did not match).
class CollectiveAborted : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

// The collectives of a group of replicas, whatever carries them: the
// in-process LocalGroup, the hierarchical group that adds MPI across
// processes (ops/collectives/collective_mpi.h), or NCCL among GPUs (ops/cuda/nccl_comm.h).
// `rank` is a member of this process, 0..size()-1; members of all processes
// are numbered globally, this process's from global_offset(). Every member
// of every process issues the same sequence of calls (matching is by call
// order). A collective not done within timeout_s() is an error in every
// member (CollectiveTimeout), as is every call after Abort() or a failure.
class Collective {
 public:
  virtual ~Collective() = default;

  virtual int size() const = 0;
  virtual int global_size() const = 0;
  virtual int global_offset() const = 0;
  virtual double timeout_s() const = 0;

  // Whether calls only enqueue the collective (NCCL: on the GPU, in order
  // after the member's work), finished by Wait(rank); else every call blocks
  // until its result is in place, and a caller that wants overlap issues
  // them from a thread of its own.
  virtual bool enqueues() const { return false; }

  // data[0..count) of every member becomes (the sum over all members of all
  // processes) * scale, bitwise the same in every member. `tag` names the
  // collective in errors ("bucket 3 (fc1.weight..conv2.bias)").
  virtual void AllReduceSum(int rank, float* data, int64_t count, const std::string& tag,
                            float scale) = 0;
  // Global member 0's data[0..count) is copied to every member.
  virtual void Broadcast(int rank, float* data, int64_t count, const std::string& tag) = 0;
  // Returns once every member of every process has called it.
  virtual void Barrier(int rank, const std::string& tag) = 0;
  // Finishes every collective `rank` has issued (a no-op where calls block).
  virtual void Wait(int /*rank*/) {}

  // Breaks the group: every waiting and every later call of every member
  // throws CollectiveAborted with `reason`. Thread-safe; the first reason wins.
  virtual void Abort(const std::string& reason) = 0;
  virtual bool broken() const = 0;
};

// N participants in one process. Rank r (0..N-1) calls from its own thread;
// calls block until every participant has arrived and the result is in
// every participant's buffer.
//
// Reduction: once all have arrived, the buffers are split into N cache-line
// aligned chunks and participant p reduces chunk p of every buffer (a
// reduce-scatter fused with the copy-back: each element is read once from
// each buffer and written once to each, no temporary of the full size). The
// sum is taken in the order of the run's one reduction tree
// (ops/collectives/reduction_tree.h): ((x0 + x1) + (x2 + x3)) + x4, then
// multiplied by `scale`. So the result is bitwise independent of arrival
// order and thread timing, identical on every rank; where the group is part
// of the replicas of many processes (PlaceInTree), it sums its maximal
// complete subtrees and the root step adds them across processes, so the
// sum does not depend on how replicas are spread over processes.
//
// Waiting spins for a few microseconds, then blocks on a condition variable:
// replicas may share cores with other work.
class LocalGroup final : public Collective {
 public:
  // Collectives that may be in flight at once (issued by different threads
  // of each rank); more wait for a free slot (counted in their timeout).
  static constexpr int kMaxInFlight = 16;

  // size participants; a collective not complete after timeout_s seconds
  // throws CollectiveTimeout in every waiting participant. `name` prefixes
  // messages (e.g. "replicas on host1").
  explicit LocalGroup(int size, double timeout_s = 300.0, std::string name = "local group");
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int size() const override { return size_; }
  int global_size() const override { return size_; }
  int global_offset() const override { return 0; }
  double timeout_s() const override { return timeout_s_; }

  // This group's ranks are leaves [first_leaf, first_leaf + size()) of the
  // tree over `leaves` (the run's logical replicas, over every process;
  // by default [0, size()) of size()). Call before the first collective.
  void PlaceInTree(int first_leaf, int leaves);
  // The maximal complete subtrees of that tree inside this group's leaves.
  const std::vector<LeafRange>& segments() const { return segments_; }

  // An all-reduce's step across processes: given the partial sums of
  // segments() (in the buffers of their first ranks, rank 0's first), it
  // leaves the sum over every leaf in partials[0].
  using PartialsStep = std::function<void(const std::vector<float*>& partials)>;

  // data[0..count) of every rank becomes (sum over ranks in tree order) *
  // scale. `tag` names the collective in errors, e.g. "bucket 3
  // (fc1.weight..conv2.bias)", and must be the same on every rank (it is
  // part of the mismatch check).
  //
  // root_step (optional; only rank 0's is used, the others pass none): run
  // on rank 0's thread once the in-process partial sums are in place, and
  // before the scale and the copy of rank 0's buffer to every rank; the
  // other ranks wait for it without a timeout, so it must bound its own
  // time. This is the hook for the cross-process all-reduce
  // (HierarchicalAllReduce). If it throws, every rank throws the same
  // message and the group is broken.
  void AllReduceSum(int rank, float* data, int64_t count, const std::string& tag, float scale,
                    const PartialsStep& root_step);
  void AllReduceSum(int rank, float* data, int64_t count, const std::string& tag,
                    float scale = 1.0f) override {
    AllReduceSum(rank, data, count, tag, scale, nullptr);
  }

  // AllReduceSum with scale = 1.0f / size(): the mean over the participants.
  void AllReduceMean(int rank, float* data, int64_t count, const std::string& tag);

  // root's data[0..count) becomes the sum over ranks (tree order); the other
  // buffers are read only.
  void ReduceSum(int rank, int root, float* data, int64_t count, const std::string& tag);

  // root's data[0..count) is copied to every rank's buffer. root_step
  // (optional, only root's is used) runs on root's thread before the copy,
  // e.g. to receive the data from another process first.
  void Broadcast(int rank, int root, float* data, int64_t count, const std::string& tag,
                 const std::function<void()>& root_step = nullptr);
  void Broadcast(int rank, float* data, int64_t count, const std::string& tag) override {
    Broadcast(rank, 0, data, count, tag);
  }
  void BroadcastBytes(int rank, int root, void* data, int64_t bytes, const std::string& tag,
                      const std::function<void()>& root_step = nullptr);

  // Returns once every rank has called Barrier.
  void Barrier(int rank, const std::string& tag) override;

  // Breaks the group: every participant waiting in it (except in a
  // collective that has all its participants and so completes) and every
  // later call throws CollectiveAborted with `reason`. Call it from a
  // replica that failed, e.g. with the exception of its backward, so the
  // others fail at once instead of waiting for the timeout. Thread-safe;
  // the first reason wins.
  void Abort(const std::string& reason) override;

  // Whether the group is broken, and why (empty when not).
  bool broken() const override { return broken_.load(std::memory_order_acquire); }
  std::string broken_reason() const;

  // How many collectives `rank` has entered (for progress reports and for
  // tests that order calls from several threads).
  uint64_t issued(int rank) const;

 private:
  enum class Op { kAllReduce, kReduce, kBroadcast, kBarrier };
  struct Slot;
  struct Call {
    Op op;
    int rank;
    int root;
    void* data;
    int64_t count;  // elements (floats) for reductions, bytes for broadcasts
    float scale;
    const std::string* tag;
    const std::function<void()>* root_step;  // a broadcast's
    const PartialsStep* reduce_step;         // an all-reduce's
  };

  using Deadline = std::chrono::steady_clock::time_point;

  // A collective, in the steps below: check the call, take the slot, register
  // (matching the others' calls), wait for every rank, compute, leave.
  void Run(const Call& call);
  void CheckCall(const Call& call) const;
  void TakeSlot(const Call& call, uint64_t seq, Slot& slot, const Deadline& deadline);
  void Register(const Call& call, uint64_t seq, Slot& slot);
  // The collective's description if a call differs from the first's, or
  // two ranks' buffers overlap ("" if not); under the slot's lock.
  std::string Mismatch(const Call& call, uint64_t seq, const Slot& slot) const;
  std::string Overlap(const Call& call, uint64_t seq, const Slot& slot) const;
  void AwaitAll(const Call& call, uint64_t seq, Slot& slot, const Deadline& deadline);
  // How the root's step went (a two-phase collective), for every rank to throw.
  struct StepOutcome {
    bool failed = false, timeout = false;
    std::string error;
  };
  StepOutcome Work(const Call& call, Slot& slot);
  void Leave(const Call& call, uint64_t seq, Slot& slot);
  // Waits, spinning first, until pred() holds or the deadline passes (never,
  // when deadline is null). Returns pred().
  template <typename Pred>
  bool WaitFor(Slot& slot, Pred pred, const std::chrono::steady_clock::time_point* deadline);
  void Notify(Slot& slot);
  // Marks the group broken (first reason wins) and wakes every waiter.
  void Break(bool timeout, const std::string& reason);
  [[noreturn]] void ThrowBroken(const Call& call, uint64_t seq) const;
  std::string Describe(const Call& call, uint64_t seq) const;
  void Compute(Slot& slot, int rank, int phase);

  const int size_;
  const double timeout_s_;
  const std::string name_;
  int first_leaf_ = 0;
  std::vector<LeafRange> segments_{{0, size_}};
  std::unique_ptr<Slot[]> slots_;
  std::unique_ptr<std::atomic<uint64_t>[]> next_seq_;  // per rank

  std::atomic<bool> broken_{false};
  bool broken_by_timeout_ = false;  // guarded by broken_mu_
  std::string broken_reason_;       // guarded by broken_mu_
  mutable std::mutex broken_mu_;
};

}  // namespace cnnflow
