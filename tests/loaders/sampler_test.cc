#include "loaders/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

#include "ops/error.h"

namespace cnnflow {
namespace {

std::vector<std::vector<int64_t>> AllShards(SamplerOptions o, int64_t epoch) {
  std::vector<std::vector<int64_t>> shards;
  for (int r = 0; r < o.world_size; ++r) {
    o.rank = r;
    shards.push_back(ShardedSampler(o).EpochIndices(epoch));
  }
  return shards;
}

TEST(ShardedSampler, ShardsAreDisjointAndCoverTheDataSet) {
  for (int world : {1, 2, 4, 5}) {
    SamplerOptions o{.dataset_size = 100, .seed = 7, .world_size = world};
    const auto shards = AllShards(o, 3);
    std::vector<int64_t> all;
    for (const auto& s : shards) {
      EXPECT_EQ(static_cast<int64_t>(s.size()), 100 / world);
      all.insert(all.end(), s.begin(), s.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> want(100);
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(all, want) << "world " << world;  // disjoint and complete
  }
}

TEST(ShardedSampler, RanksInterleaveOneEpochPermutation) {
  // Rank r holds positions r, r + world, ... of the world-1 order.
  const auto whole = ShardedSampler({.dataset_size = 12, .seed = 3}).EpochIndices(5);
  const auto shards = AllShards({.dataset_size = 12, .seed = 3, .world_size = 3}, 5);
  for (int r = 0; r < 3; ++r)
    for (size_t k = 0; k < shards[r].size(); ++k) EXPECT_EQ(shards[r][k], whole[r + 3 * k]);
}

TEST(ShardedSampler, BlocksMakeTheGlobalBatchIndependentOfTheWorld) {
  // With block b, step k's batches of the ranks, in rank order, are the
  // world-1 order's positions [k b W, (k + 1) b W): the global batch one
  // process with all replicas would take, the last, short run (here 100 =
  // 4 runs of 24 + 4) included: nothing padded, nothing repeated.
  const auto whole = ShardedSampler({.dataset_size = 100, .seed = 3}).EpochIndices(2);
  for (int world : {2, 3, 4}) {
    SamplerOptions o{.dataset_size = 100, .seed = 3, .world_size = world, .block = 24 / world};
    const auto shards = AllShards(o, 2);
    std::vector<int64_t> joined;
    const int64_t b = 24 / world;
    for (size_t k = 0; k * b < shards[0].size() || k * b < shards[world - 1].size(); ++k)
      for (int r = 0; r < world; ++r) {
        const auto& s = shards[r];
        joined.insert(joined.end(), s.begin() + std::min<int64_t>(s.size(), k * b),
                      s.begin() + std::min<int64_t>(s.size(), (k + 1) * b));
      }
    EXPECT_EQ(joined, whole) << "world " << world;
    for (int r = 0; r < world; ++r) {
      o.rank = r;
      EXPECT_EQ(ShardedSampler(o).num_samples(), static_cast<int64_t>(shards[r].size()));
    }
  }
}

// The short last run of L positions falls to the ranks as L rows fall to
// in-process replicas (ShardRows: [L r / W, L (r + 1) / W)): uneven parts,
// some empty when L < W, so `mpirun -np W` trains each replica on the rows
// one process with W replicas would give it.
TEST(ShardedSampler, TheShortLastRunIsCutAsReplicasCutABatch) {
  const int64_t block = 8;
  for (int world : {2, 3, 4}) {
    for (int64_t last : {1, 2, 5, 7, 13}) {
      if (last >= block * world) continue;
      const int64_t n = 3 * block * world + last;
      SamplerOptions o{.dataset_size = n, .seed = 5, .world_size = world, .block = block};
      const auto whole = ShardedSampler({.dataset_size = n, .seed = 5}).EpochIndices(1);
      const auto shards = AllShards(o, 1);
      for (int r = 0; r < world; ++r) {
        const int64_t from = last * r / world, to = last * (r + 1) / world;
        ASSERT_EQ(static_cast<int64_t>(shards[r].size()), 3 * block + to - from)
            << "rank " << r << " of " << world << ", last run " << last;
        const std::vector<int64_t> tail(shards[r].begin() + 3 * block, shards[r].end());
        const std::vector<int64_t> want(whole.begin() + n - last + from,
                                        whole.begin() + n - last + to);
        EXPECT_EQ(tail, want) << "rank " << r << " of " << world << ", last run " << last;
      }
      // drop_last: the short run goes, every rank keeps its whole blocks.
      o.drop_last = true;
      for (const auto& s : AllShards(o, 1)) EXPECT_EQ(static_cast<int64_t>(s.size()), 3 * block);
    }
  }
}

TEST(ShardedSampler, OrderChangesWithTheEpochAndIsFixedBySeed) {
  ShardedSampler a({.dataset_size = 1000, .seed = 42});
  ShardedSampler b({.dataset_size = 1000, .seed = 42});
  ShardedSampler c({.dataset_size = 1000, .seed = 43});
  EXPECT_EQ(a.EpochIndices(0), b.EpochIndices(0));
  EXPECT_EQ(a.EpochIndices(1), b.EpochIndices(1));
  EXPECT_NE(a.EpochIndices(0), a.EpochIndices(1));
  EXPECT_NE(a.EpochIndices(0), c.EpochIndices(0));
  // A shuffle, not the identity, and still a permutation.
  std::vector<int64_t> idx = a.EpochIndices(0);
  std::vector<int64_t> id(1000);
  std::iota(id.begin(), id.end(), 0);
  EXPECT_NE(idx, id);
  std::sort(idx.begin(), idx.end());
  EXPECT_EQ(idx, id);
}

TEST(ShardedSampler, WithoutShuffleIsInOrder) {
  ShardedSampler s({.dataset_size = 7, .shuffle = false});
  EXPECT_EQ(s.EpochIndices(0), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(s.EpochIndices(9), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  const auto shards = AllShards({.dataset_size = 7, .shuffle = false, .world_size = 2}, 0);
  EXPECT_EQ(shards[0], (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(shards[1], (std::vector<int64_t>{1, 3, 5, 0}));  // padded with the first index
}

TEST(ShardedSampler, PaddingRepeatsTheStartOfTheOrder) {
  // 10 samples over 3 ranks: 4 each, the 2 padded entries are the first
  // two of the epoch's order (torch's DistributedSampler).
  SamplerOptions o{.dataset_size = 10, .seed = 1, .world_size = 3};
  const auto whole = ShardedSampler({.dataset_size = 10, .seed = 1}).EpochIndices(2);
  const auto shards = AllShards(o, 2);
  std::multiset<int64_t> all;
  for (const auto& s : shards) {
    EXPECT_EQ(s.size(), 4u);
    all.insert(s.begin(), s.end());
  }
  EXPECT_EQ(ShardedSampler(o).num_samples(), 4);
  EXPECT_EQ(all.size(), 12u);
  for (int64_t i = 0; i < 10; ++i) EXPECT_GE(all.count(i), 1u) << i;  // covers the set
  EXPECT_EQ(all.count(whole[0]), 2u);
  EXPECT_EQ(all.count(whole[1]), 2u);
  // Positions 10 and 11 of the padded order fall to ranks 1 and 2.
  EXPECT_EQ(shards[1][3], whole[0]);
  EXPECT_EQ(shards[2][3], whole[1]);
}

TEST(ShardedSampler, PaddingWhenTheSetIsSmallerThanTheWorld) {
  const auto shards = AllShards({.dataset_size = 2, .shuffle = false, .world_size = 5}, 0);
  for (int r = 0; r < 5; ++r) EXPECT_EQ(shards[r], (std::vector<int64_t>{r % 2})) << r;
}

TEST(ShardedSampler, DropLastGivesEveryRankTheSameCount) {
  SamplerOptions o{.dataset_size = 10, .seed = 1, .world_size = 3, .drop_last = true};
  const auto shards = AllShards(o, 0);
  std::set<int64_t> all;
  for (const auto& s : shards) {
    EXPECT_EQ(s.size(), 3u);
    all.insert(s.begin(), s.end());
  }
  EXPECT_EQ(all.size(), 9u);  // disjoint; one sample dropped
  EXPECT_EQ(ShardedSampler(o).num_samples(), 3);
}

TEST(ShardedSampler, NumBatches) {
  EXPECT_EQ(ShardedSampler::NumBatches(100, 32, false), 4);
  EXPECT_EQ(ShardedSampler::NumBatches(100, 32, true), 3);
  EXPECT_EQ(ShardedSampler::NumBatches(96, 32, false), 3);
  EXPECT_EQ(ShardedSampler::NumBatches(0, 32, false), 0);
  EXPECT_THROW(ShardedSampler::NumBatches(10, 0, false), Error);
}

TEST(ShardedSampler, RejectsBadRanks) {
  EXPECT_THROW(ShardedSampler({.dataset_size = 10, .rank = 2, .world_size = 2}), ConfigError);
  EXPECT_THROW(ShardedSampler({.dataset_size = 10, .world_size = 0}), ConfigError);
  EXPECT_THROW(ShardedSampler({.dataset_size = -1}), ConfigError);
}

// Evaluation shards: every sample exactly once, shard sizes within one,
// also when the world is larger than the set.
TEST(ShardedSampler, UnevenShardsReadEverySampleExactlyOnce) {
  for (int64_t n : {0, 3, 10, 101}) {
    for (int world : {1, 2, 3, 4, 7}) {
      SamplerOptions o{.dataset_size = n, .seed = 9, .world_size = world};
      o.drop_last = true;  // overridden
      o.uneven = true;
      const auto shards = AllShards(o, 2);
      std::vector<int64_t> all;
      size_t lo = SIZE_MAX, hi = 0;
      for (int r = 0; r < world; ++r) {
        o.rank = r;
        EXPECT_EQ(ShardedSampler(o).num_samples(), static_cast<int64_t>(shards[r].size()));
        lo = std::min(lo, shards[r].size());
        hi = std::max(hi, shards[r].size());
        all.insert(all.end(), shards[r].begin(), shards[r].end());
      }
      EXPECT_LE(hi - lo, 1u) << n << " over " << world;
      std::sort(all.begin(), all.end());
      std::vector<int64_t> want(n);
      std::iota(want.begin(), want.end(), 0);
      EXPECT_EQ(all, want) << n << " over " << world;
    }
  }
}

}  // namespace
}  // namespace cnnflow
