// The hierarchical all-reduce that composes the collectives across
// processes (MpiWorld, ops/collectives/mpi_world.h) with the in-process
// LocalGroup: reduce inside the process, all-reduce across processes by one
// leader per process, broadcast inside.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ops/collectives/collective.h"
#include "ops/collectives/mpi_world.h"
#include "ops/device.h"

namespace cnnflow {

// Averages (or sums) gradient buckets over every replica of every process:
// the replicas of all processes are the leaves of one reduction tree
// (ops/collectives/reduction_tree.h), each process's a contiguous range in
// rank order (of any size: 3 + 3 + 2); the LocalGroup sums the process's
// maximal complete subtrees, local rank 0 adds those partial sums across
// processes along the same tree, and the result is scaled and copied back
// to every local replica. Every replica of every process ends with the same
// bits. Collectives are matched by call order (see ops/collectives/collective.h); local
// rank 0's calls fix the order of the MPI collectives, which are started in
// that order even when several are in flight.
class HierarchicalAllReduce final : public Collective {
 public:
  // Collective across processes (exchanges the local sizes): every process
  // constructs it at the same point. Processes may have different numbers
  // of local replicas. timeout_s bounds the MPI part of each collective; the
  // LocalGroup's own timeout bounds the wait for local replicas.
  HierarchicalAllReduce(LocalGroup& local, MpiWorld& world, double timeout_s);
  // The same over a LocalGroup of `local_size` replicas of its own.
  HierarchicalAllReduce(int local_size, MpiWorld& world, double timeout_s);

  int size() const override { return local_.size(); }
  int global_size() const override { return global_size_; }
  // This process's first replica in the global numbering (replicas of
  // lower ranks come first).
  int global_offset() const override { return global_offset_; }
  double timeout_s() const override { return timeout_s_; }

  // data becomes the sum over all global_size() replicas, times scale.
  void AllReduceSum(int local_rank, float* data, int64_t count, const std::string& tag,
                    float scale = 1.0f) override;
  // scale = 1.0f / global_size(): DDP's gradient of the mean loss.
  void AllReduceMean(int local_rank, float* data, int64_t count, const std::string& tag);
  // Process 0's replica 0's data is copied to every replica of every
  // process (e.g. the initial parameters).
  void Broadcast(int local_rank, float* data, int64_t count, const std::string& tag) override;
  // Every replica of every process (a one-float all-reduce).
  void Barrier(int local_rank, const std::string& tag) override;
  void Abort(const std::string& reason) override { local_.Abort(reason); }
  bool broken() const override { return local_.broken() || world_.broken(); }

 private:
  // Exchanges the local sizes: global_size_, global_offset_.
  void GatherSizes();
  // Runs start() when it is `ticket`'s turn, so MPI collectives start in
  // local rank 0's call order on every process.
  MpiRequest StartInOrder(uint64_t ticket, const std::string& tag,
                          const std::function<MpiRequest()>& start);

  std::unique_ptr<LocalGroup> owned_;  // the second constructor's
  LocalGroup& local_;
  MpiWorld& world_;
  const double timeout_s_;
  int global_size_ = 1;
  int global_offset_ = 0;
  std::vector<LeafRange> layout_;  // every process's replicas, as leaves of the one tree
  std::atomic<uint64_t> next_ticket_{0};
  uint64_t turn_ = 0;  // guarded by turn_mu_
  std::mutex turn_mu_;
  std::condition_variable turn_cv_;
};

// The collectives of data-parallel replicas on `devices` (this process's),
// across every process of `world`: NCCL for GPUs (MakeGpuCollective), else
// the in-process group with MPI across processes. Null when there is
// nobody to talk to (one replica in one process). Every process calls it at
// the same point.
std::unique_ptr<Collective> MakeReplicaCollective(const std::vector<Device>& devices,
                                                  MpiWorld& world, double timeout_s);

// The NCCL group of the GPU replicas on cuda:`devices` (ops/cuda/nccl_comm.h),
// or, where one GPU is listed several times (and nothing else), the group
// of its lanes (ops/cuda/lane_group.h).
// Defined in ops/cuda/ (nccl_comm.cc; device_stub.cc in a build without
// CUDA, where it throws), so this room needs no CUDA header.
std::unique_ptr<Collective> MakeGpuCollective(const std::vector<int>& devices, MpiWorld& world,
                                              double timeout_s);

}  // namespace cnnflow
