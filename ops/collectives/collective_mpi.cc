// The hierarchical all-reduce over the in-process group and MPI (see
// ops/collectives/collective_mpi.h).
#include "ops/collectives/collective_mpi.h"

#include <chrono>

namespace cnnflow {
HierarchicalAllReduce::HierarchicalAllReduce(LocalGroup& local, MpiWorld& world, double timeout_s)
    : local_(local), world_(world), timeout_s_(timeout_s) {
  GatherSizes();
}

HierarchicalAllReduce::HierarchicalAllReduce(int local_size, MpiWorld& world, double timeout_s)
    : owned_(std::make_unique<LocalGroup>(local_size, timeout_s,
                                          StrCat("replicas of ", world.Where()))),
      local_(*owned_),
      world_(world),
      timeout_s_(timeout_s) {
  GatherSizes();
}

void HierarchicalAllReduce::GatherSizes() {
  global_size_ = local_.size();
  if (world_.active() && world_.size() > 1) {
    const std::vector<uint64_t> sizes =
        world_.AllGather(static_cast<uint64_t>(local_.size()), "local replica counts", timeout_s_);
    global_size_ = 0;
    for (int r = 0; r < world_.size(); ++r) {
      if (r < world_.rank()) global_offset_ += static_cast<int>(sizes[r]);
      layout_.push_back({global_size_, global_size_ + static_cast<int>(sizes[r])});
      global_size_ += static_cast<int>(sizes[r]);
      if (sizes[r] == 0) {
        throw Error(StrCat(world_.Where(), ": process ", r, " has no replica"));
      }
    }
    local_.PlaceInTree(global_offset_, global_size_);
  }
}

void HierarchicalAllReduce::Barrier(int local_rank, const std::string& tag) {
  float one = 1.0f;
  AllReduceSum(local_rank, &one, 1, tag);
}

std::unique_ptr<Collective> MakeReplicaCollective(const std::vector<Device>& devices,
                                                  MpiWorld& world, double timeout_s) {
  if (devices.size() < 2 && !world.active()) return nullptr;
  if (!devices.empty() && devices[0].is_cuda()) {
    std::vector<int> indices;
    for (const Device& d : devices) indices.push_back(d.index);
    return MakeGpuCollective(indices, world, timeout_s);
  }
  return std::make_unique<HierarchicalAllReduce>(static_cast<int>(devices.size()), world,
                                                 timeout_s);
}

MpiRequest HierarchicalAllReduce::StartInOrder(uint64_t ticket, const std::string& tag,
                                               const std::function<MpiRequest()>& start) {
  std::unique_lock<std::mutex> lock(turn_mu_);
  const MpiWorld::WaitLimit limit = MpiWorld::LimitFor(timeout_s_);
  if (!turn_cv_.wait_until(lock, DeadlineIn(limit.seconds), [&] { return turn_ == ticket; })) {
    throw CollectiveTimeout(StrCat(
        world_.Where(), ": '", tag, "' could not start its MPI collective within ", limit.Text(),
        ": the collective this process started before it (#", turn_, ") never started"));
  }
  MpiRequest r;
  try {
    r = start();
  } catch (...) {
    ++turn_;
    turn_cv_.notify_all();
    throw;
  }
  ++turn_;
  lock.unlock();
  turn_cv_.notify_all();
  return r;
}

void HierarchicalAllReduce::AllReduceSum(int local_rank, float* data, int64_t count,
                                         const std::string& tag, float scale) {
  if (!world_.active() || world_.size() == 1) {
    local_.AllReduceSum(local_rank, data, count, tag, scale);
    return;
  }
  LocalGroup::PartialsStep step;
  if (local_rank == 0) {
    const uint64_t ticket = next_ticket_.fetch_add(1);
    step = [this, ticket, count, &tag](const std::vector<float*>& partials) {
      MpiRequest r = StartInOrder(
          ticket, tag, [&] { return world_.StartAllReduceSum(partials, count, layout_, tag); });
      world_.Wait(r, timeout_s_);
    };
  }
  local_.AllReduceSum(local_rank, data, count, tag, scale, step);
}

void HierarchicalAllReduce::AllReduceMean(int local_rank, float* data, int64_t count,
                                          const std::string& tag) {
  AllReduceSum(local_rank, data, count, tag, 1.0f / static_cast<float>(global_size_));
}

void HierarchicalAllReduce::Broadcast(int local_rank, float* data, int64_t count,
                                      const std::string& tag) {
  if (!world_.active() || world_.size() == 1) {
    local_.Broadcast(local_rank, 0, data, count, tag);
    return;
  }
  std::function<void()> step;
  if (local_rank == 0) {
    const uint64_t ticket = next_ticket_.fetch_add(1);
    step = [this, ticket, data, count, &tag] {
      MpiRequest r = StartInOrder(ticket, tag, [&] {
        return world_.StartBroadcastBytes(data, count * static_cast<int64_t>(sizeof(float)), 0,
                                          tag);
      });
      world_.Wait(r, timeout_s_);
    };
  }
  local_.Broadcast(local_rank, 0, data, count, tag, step);
}

}  // namespace cnnflow
