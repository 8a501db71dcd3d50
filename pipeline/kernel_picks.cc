#include "pipeline/kernel_picks.h"

#include <algorithm>
#include <string>

#include "loaders/sampler.h"
#include "ops/cpu/conv/pick_cache.h"
#include "ops/layers/conv2d.h"

namespace cnnflow {

std::vector<int64_t> ReplicaBatchSizes(int64_t samples, int64_t replica_batch, int replicas,
                                       bool drop_last) {
  std::vector<int64_t> sizes = {replica_batch};
  const int64_t last = samples % (replica_batch * replicas);
  if (last > 0 && !drop_last) {
    for (int k = 0; k < replicas; ++k) {
      const auto [b, e] = ShardedSampler::Part(last, k, replicas);
      if (e > b) sizes.push_back(e - b);
    }
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

std::vector<int64_t> EvalBatchSizes(int64_t samples, int64_t batch, int64_t micro_batch,
                                    int processes) {
  std::vector<int64_t> sizes;
  auto add_batch = [&](int64_t rows) {
    const int64_t m = micro_batch > 0 ? std::min(micro_batch, rows) : rows;
    if (m > 0) sizes.push_back(m);
    if (m > 0 && rows % m > 0) sizes.push_back(rows % m);
  };
  for (int p = 0; p < processes && batch > 0; ++p) {
    const int64_t shard = (samples - p + processes - 1) / processes;
    if (shard >= batch) add_batch(batch);
    if (shard % batch > 0) add_batch(shard % batch);
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

int ShareKernelPicks(Model& model, const std::vector<int64_t>& batch_sizes, MpiWorld& world,
                     double timeout_s) {
  if (!world.active() || world.size() < 2) return 0;
  std::string picks;
  if (world.rank() == 0) {
    for (int i = 0; i < model.num_layers(); ++i) {
      auto* conv = dynamic_cast<Conv2d*>(&model.layer(i));
      if (conv == nullptr) continue;
      for (int64_t n : batch_sizes) conv->PlanFor(n, conv->parameters()[0].value.dtype());
    }
    picks = cpu::ExportPicks();
  }
  uint64_t bytes = picks.size();
  world.BroadcastBytes(&bytes, sizeof bytes, 0, "kernel picks (size)", timeout_s);
  picks.resize(bytes);
  world.BroadcastBytes(picks.data(), static_cast<int64_t>(bytes), 0, "kernel picks", timeout_s);
  if (world.rank() != 0) cpu::AdoptPicks(picks);
  return static_cast<int>(std::count(picks.begin(), picks.end(), '\n'));
}

}  // namespace cnnflow
