#include "loaders/sampler.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "ops/error.h"
#include "ops/random.h"

namespace cnnflow {

ShardedSampler::ShardedSampler(SamplerOptions options) : options_(options) {
  const SamplerOptions& o = options_;
  if (o.world_size < 1)
    throw ConfigError(StrCat("sampler: world_size must be >= 1, got ", o.world_size));
  if (o.rank < 0 || o.rank >= o.world_size) {
    throw ConfigError(StrCat("sampler: rank ", o.rank, " outside [0, ", o.world_size, ")"));
  }
  if (o.dataset_size < 0) {
    throw ConfigError(StrCat("sampler: negative dataset size ", o.dataset_size));
  }
  if (o.uneven) {
    num_samples_ = (o.dataset_size - o.rank + o.world_size - 1) / o.world_size;
  } else if (o.block > 0) {
    if (o.blocks > 0 &&
        (o.first_block < 0 || o.rank_blocks < 1 || o.first_block + o.rank_blocks > o.blocks)) {
      throw ConfigError(StrCat("sampler: blocks [", o.first_block, ", ",
                               o.first_block + o.rank_blocks, ") outside [0, ", o.blocks, ")"));
    }
    const int64_t run = RunLength();
    const int64_t tail = o.drop_last ? 0 : o.dataset_size % run;
    const auto [b, e] = RunPart(tail);
    const auto [rb, re] = RunPart(run);
    num_samples_ = o.dataset_size / run * (re - rb) + (e - b);
  } else {
    num_samples_ = o.drop_last ? o.dataset_size / o.world_size
                               : (o.dataset_size + o.world_size - 1) / o.world_size;
  }
}

std::vector<int64_t> ShardedSampler::EpochIndices(int64_t epoch) const {
  const SamplerOptions& o = options_;
  const int64_t n = o.dataset_size;
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  if (o.shuffle) {
    Rng rng(o.seed, static_cast<uint64_t>(epoch));
    for (int64_t i = n - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i + 1)));
      std::swap(order[i], order[j]);
    }
  }
  std::vector<int64_t> mine;
  mine.reserve(num_samples_);
  if (o.block > 0 && !o.uneven) {
    // Whole runs, then this rank's part of the short one (none: drop_last).
    const int64_t run = RunLength();
    for (int64_t start = 0; start < n; start += run) {
      const int64_t len = std::min(run, n - start);
      if (len < run && o.drop_last) break;
      const auto [b, e] = RunPart(len);
      mine.insert(mine.end(), order.begin() + start + b, order.begin() + start + e);
    }
    return mine;
  }
  const int64_t total = num_samples_ * o.world_size;
  if (total > n && !o.uneven) {
    // Pad by repeating from the start, as often as needed (torch does too).
    order.reserve(total);
    for (int64_t i = 0; static_cast<int64_t>(order.size()) < total; ++i) order.push_back(order[i]);
  }
  for (int64_t k = 0; k < num_samples_; ++k) mine.push_back(order[o.rank + k * o.world_size]);
  return mine;
}

int64_t ShardedSampler::RunLength() const {
  const SamplerOptions& o = options_;
  return o.block * (o.blocks > 0 ? o.blocks : o.world_size);
}

std::pair<int64_t, int64_t> ShardedSampler::RunPart(int64_t len) const {
  const SamplerOptions& o = options_;
  if (o.blocks == 0) return Part(len, o.rank, o.world_size);
  return {len * o.first_block / o.blocks, len * (o.first_block + o.rank_blocks) / o.blocks};
}

int64_t ShardedSampler::NumBatches(int64_t num_samples, int64_t batch, bool drop_last_batch) {
  CNNFLOW_ENFORCE(batch > 0, "batch size must be positive, got ", batch);
  if (num_samples <= 0) return 0;
  return drop_last_batch ? num_samples / batch : (num_samples + batch - 1) / batch;
}

}  // namespace cnnflow
