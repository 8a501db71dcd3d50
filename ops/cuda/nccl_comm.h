// NCCL collectives among the GPU replicas of a data-parallel job: every
// replica of every process (ops/parallel/data_parallel.h's replicas on cuda:K), one
// NCCL communicator rank per replica. The GPU counterpart of LocalGroup +
// HierarchicalAllReduce (ops/collectives/collective.h, ops/collectives/collective_mpi.h): NCCL
// itself spans processes and nodes, so there is no hierarchy to build.
//
// Streams: each replica has its own NCCL stream. A collective is ordered
// after the work already issued on the replica's compute stream
// (ops/cuda/context.h) by an event, runs on the NCCL stream, and returns at
// once; Wait() orders the compute stream after every collective issued so
// far. A buffer handed to a collective must stay allocated (not go back to
// the caching pool) until Wait() returned.
//
// Matching: as in NCCL and MPI, by call order: every replica issues the same
// sequence of collectives (same sizes, same roots). Each replica's calls come
// from one host thread at a time (its communication thread); replicas of one
// process must call from different threads, since a collective may wait on
// the host for its peers (connection set-up on first use).
//
// Hangs become errors: communicators are non-blocking (config.blocking = 0),
// so no NCCL call waits unboundedly; start-up and every host wait poll
// against timeout_s, and on a timeout or an asynchronous NCCL error every
// communicator of the group is aborted and CollectiveTimeout /
// CollectiveAborted is thrown naming the collective's tag, the replica and
// its GPU. After that (or Abort()) the group is broken: every later call of
// every replica throws. Make a new group to go on.
//
// Plain C++ (no CUDA or NCCL types), so code compiled without CUDA can
// include it; the class itself is defined only when CNNFLOW_WITH_CUDA is on
// (ops/cuda/nccl_comm.cc). The small host helpers below are inline and work
// in every build.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ops/collectives/collective.h"
#include "ops/error.h"

namespace cnnflow {

class MpiWorld;

// Where this process's replicas sit in the job's global numbering.
struct NcclLayout {
  int global_size = 0;    // replicas over all processes
  int global_offset = 0;  // global rank of this process's replica 0
};

// counts[p]: replicas of process p (as gathered from every process); rank:
// this process. Global rank of replica r of process p = sum of counts[q] for
// q < p, plus r. Throws when a count is not positive or rank is out of range.
inline NcclLayout ComputeNcclLayout(const std::vector<uint64_t>& counts, int rank) {
  if (rank < 0 || rank >= static_cast<int>(counts.size())) {
    throw Error(StrCat("NCCL layout: process rank ", rank, " outside the ", counts.size(),
                       " processes of the job"));
  }
  NcclLayout layout;
  for (size_t p = 0; p < counts.size(); ++p) {
    if (counts[p] == 0 || counts[p] > (1u << 20)) {
      throw Error(StrCat("NCCL layout: process ", p, " has ", counts[p], " GPU replicas; ",
                         counts[p] == 0 ? "every process needs at least one"
                                        : "that is not a plausible count (corrupt exchange?)"));
    }
    if (static_cast<int>(p) < rank) layout.global_offset += static_cast<int>(counts[p]);
    layout.global_size += static_cast<int>(counts[p]);
  }
  return layout;
}

// NCCL forbids two ranks of one communicator on the same GPU (it may hang):
// throws naming the repeated device and the replicas that share it, or a
// negative index.
inline void CheckNcclDevices(const std::vector<int>& devices) {
  if (devices.empty())
    throw Error("NCCL group: no GPU replicas in this process (device list empty)");
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0) {
      throw Error(StrCat("NCCL group: replica ", i, " has GPU index ", devices[i],
                         " (must be a cuda:K with K >= 0)"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (devices[j] == devices[i]) {
        throw Error(StrCat("NCCL group: replicas ", j, " and ", i, " are both on cuda:", devices[i],
                           "; NCCL needs one GPU per replica (a communicator may not hold two "
                           "ranks on one GPU)"));
      }
    }
  }
}

// "cuda:0 (global rank 2), cuda:1 (global rank 3)": for error messages.
inline std::string DescribeNcclDevices(const std::vector<int>& devices, int global_offset) {
  std::string s;
  for (size_t i = 0; i < devices.size(); ++i) {
    s += StrCat(i ? ", " : "", "cuda:", devices[i], " (global rank ",
                global_offset + static_cast<int>(i), ")");
  }
  return s;
}

// NCCL all-reduce and broadcast among every GPU replica of every process of
// the job.
class NcclGroup final : public Collective {
 public:
  // The bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES).
  using UniqueId = std::array<char, 128>;
  // A fresh id (ncclGetUniqueId) for the low-level constructor.
  static UniqueId NewUniqueId();

  // Collective across processes: every process of `world` constructs it at
  // the same point. devices[r]: the GPU of this process's replica r (distinct;
  // processes may hold different numbers). `world` inactive = one process.
  // The replica counts are all-gathered and the NCCL id made by process 0 is
  // broadcast over `world`, both bounded by timeout_s; the communicators are
  // then made for every local device from this one thread, and a process
  // that never joins fails start-up after timeout_s with an error naming the
  // devices. With a single replica in the whole job no NCCL communicator is
  // made: the collectives are ordered no-ops (a scale still applies).
  NcclGroup(const std::vector<int>& devices, MpiWorld& world, double timeout_s = 300.0);

  // Low-level form: this process's replicas are global ranks
  // [global_offset, global_offset + devices.size()) of a group of
  // global_size, and `id` reached every participant by other means (e.g.
  // threads standing in for processes in tests). Always uses NCCL, even for
  // global_size 1.
  NcclGroup(const std::vector<int>& devices, int global_size, int global_offset, const UniqueId& id,
            double timeout_s = 300.0);

  // Finalizes and destroys the communicators (bounded by timeout_s; aborts
  // them when broken or when outstanding work does not finish).
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int size() const override { return static_cast<int>(devices_.size()); }  // local replicas
  int global_size() const override { return layout_.global_size; }
  int global_offset() const override { return layout_.global_offset; }
  int device(int r) const;
  double timeout_s() const override { return timeout_s_; }
  bool enqueues() const override { return true; }
  // Whether collectives go through NCCL (false: one replica in the job).
  bool uses_nccl() const { return use_nccl_; }

  // Replica r: data[0..count) (GPU memory on devices[r]) becomes the sum over
  // all global_size() replicas, times `scale` (NCCL's pre-multiplied sum when
  // scale != 1). Ordered after the work already issued on r's compute stream;
  // returns without waiting for the result. count 0 is a no-op. `tag` names
  // the collective in errors, e.g. "bucket 3 (fc1.weight..conv2.bias)".
  void AllReduceSum(int r, float* data, int64_t count, const std::string& tag,
                    float scale = 1.0f) override;
  // Replica r: data[0..count) of the replica with global rank
  // root_global_rank is copied into every replica's data.
  void Broadcast(int r, float* data, int64_t count, int root_global_rank, const std::string& tag);
  void Broadcast(int r, float* data, int64_t count, const std::string& tag) override {
    Broadcast(r, data, count, 0, tag);
  }
  // A one-float all-reduce on r's GPU, waited for (Wait).
  void Barrier(int r, const std::string& tag) override;

  // Replica r: makes r's compute stream wait (on the GPU) for every
  // collective r issued so far, and waits on the host until they are done.
  // A collective not done timeout_s after it was issued, or an asynchronous
  // NCCL error, aborts every communicator of the group and throws
  // CollectiveTimeout / CollectiveAborted naming the oldest unfinished
  // collective's tag, the replica and its GPU. Call once per step.
  void Wait(int r) override;

  // Breaks the group: every later (and every waiting) call of every replica
  // throws CollectiveAborted with `reason` (e.g. another replica's
  // exception). Aborts the NCCL communicators, which ends collectives stuck
  // on the GPU. Thread-safe; the first reason wins.
  void Abort(const std::string& reason) override;

  bool broken() const override { return broken_.load(std::memory_order_acquire); }
  std::string broken_reason() const;

 private:
  struct Replica;  // per-replica CUDA/NCCL state (ops/cuda/nccl_comm.cc)
  struct Pending;

  struct Issued;  // a collective handed to NCCL, not yet launched

  // Start-up: the replicas' streams, then (with NCCL) their communicators,
  // waited for within timeout_s; `what` names the start-up in errors.
  void Init(const UniqueId* id);
  void MakeReplicas();
  void StartCommunicators(const UniqueId& id, const std::string& what);
  void AwaitCommunicators(const std::string& what);
  // Aborts every replica's communicator (Break, a failed start-up).
  void AbortCommunicators();
  void CheckReplica(int r, const char* op) const;
  [[noreturn]] void ThrowBroken(int r, const char* op, const std::string& tag) const;
  // Marks the group broken (first reason wins) and aborts every communicator.
  void Break(bool timeout, const std::string& reason);
  // Breaks the group over collective `op` and throws CollectiveTimeout or
  // CollectiveAborted: "NCCL <op> '<tag>' (<count> floats<what>; every
  // communicator of the group was aborted".
  [[noreturn]] void BreakOn(bool timeout, int r, const char* op, const std::string& tag,
                            int64_t count, const std::string& what);
  void Enqueue(int r, const char* op, float* data, int64_t count, int root, float scale,
               const std::string& tag);
  // Enqueue's steps: the buffer is GPU memory of r's device; the NCCL call
  // (a broadcast from root >= 0, else the scaled sum) and the wait until
  // it is launched, each returning what failed ("" when it did); the event
  // that Wait() polls.
  void CheckDeviceBuffer(int r, const char* op, float* data, int64_t count,
                         const std::string& tag) const;
  std::string Launch(int r, const char* op, float* data, int64_t count, int root, float scale,
                     const std::string& tag, Issued* issued);
  std::string AwaitLaunch(int r, const char* op, int64_t count, const std::string& tag,
                          const Issued& issued);
  void PushPending(int r, const char* op, int64_t count, const std::string& tag);
  std::string Where(int r) const;

  std::vector<int> devices_;
  NcclLayout layout_;
  double timeout_s_;
  bool use_nccl_ = true;
  std::string world_where_;  // "rank 1 of 2: " or empty in a single process
  std::vector<std::unique_ptr<Replica>> replicas_;

  std::atomic<bool> broken_{false};
  bool broken_by_timeout_ = false;  // guarded by broken_mu_
  std::string broken_reason_;       // guarded by broken_mu_
  mutable std::mutex broken_mu_;
};

}  // namespace cnnflow
