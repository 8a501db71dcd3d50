// Which sample indices each data-parallel rank reads in an epoch, as torch's
// DistributedSampler does: one permutation per epoch, seeded by (seed,
// epoch) only, so every rank computes the same one without talking; rank r
// takes positions r, r + world, r + 2 world, ... (or blocks of them, see
// SamplerOptions::block). Together the ranks cover the data set; the shards
// are disjoint unless padding was needed.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace cnnflow {

struct SamplerOptions {
  int64_t dataset_size = 0;
  bool shuffle = true;
  uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  // When the set does not divide evenly among the ranks: false pads the
  // order by repeating its first indices (each rank gets ceil(n / world));
  // true drops the tail (each rank gets floor(n / world)).
  bool drop_last = false;
  // > 0 (training across processes): instead of every world_size-th
  // position, rank r takes the r-th `block` of each run of world_size
  // blocks (block: the samples of one rank's batch). The last, short run of
  // L positions is not padded: rank r takes its positions [L r / W,
  // L (r + 1) / W), the rows in-process replicas r of W would take of it
  // (ranks may get different counts, or none; drop_last drops that run).
  // So the global batch of every step, the last included, is the same run
  // of the order however many processes share it, and each global replica
  // trains on the same rows as in one process with all replicas (the
  // all-reduce's tree order does the rest: mpirun -np 2 equals two
  // replicas in one process bit for bit).
  int64_t block = 0;
  // In blocks, for ranks of unequal shares (a run's logical replicas split
  // 3 + 3 + 2 over processes): `block` is one replica's batch, a run is
  // `blocks` of them, and this rank takes blocks [first_block, first_block
  // + rank_blocks) of each (of the short last run of L positions, its
  // positions [L first_block / blocks, L (first_block + rank_blocks) /
  // blocks)). 0: one block a rank (block `rank` of world_size).
  int64_t blocks = 0, first_block = 0, rank_blocks = 1;
  // Neither: rank r takes positions r, r + world, ... < n, so every sample is
  // read exactly once and the shards differ by at most one (evaluation:
  // nothing counted twice, nothing left out). Overrides drop_last.
  bool uneven = false;
};

class ShardedSampler {
 public:
  // Throws ConfigError for world_size < 1, rank outside [0, world_size) or
  // a negative dataset size.
  explicit ShardedSampler(SamplerOptions options);

  // This rank's indices for `epoch` (num_samples() of them): a Fisher-Yates
  // shuffle of 0..n-1 with Rng(seed, epoch) (identity when !shuffle), padded
  // or cut to a multiple of world_size (unless uneven or in blocks), then
  // every world_size-th position from rank (or its blocks).
  std::vector<int64_t> EpochIndices(int64_t epoch) const;
  // This rank's, per epoch (in blocks or uneven, ranks may differ).
  int64_t num_samples() const { return num_samples_; }
  const SamplerOptions& options() const { return options_; }

  // Batches in an epoch of num_samples: ceil, or floor when the last
  // partial batch is dropped.
  static int64_t NumBatches(int64_t num_samples, int64_t batch, bool drop_last_batch);

  // Part r of n of `rows` in order: [rows r / n, rows (r + 1) / n). How a
  // batch's rows are cut among replicas, and the last run among ranks.
  static std::pair<int64_t, int64_t> Part(int64_t rows, int64_t r, int64_t n) {
    return {rows * r / n, rows * (r + 1) / n};
  }

 private:
  // In blocks: this rank's part [b, e) of a run of `len` positions, and a
  // whole run's length.
  std::pair<int64_t, int64_t> RunPart(int64_t len) const;
  int64_t RunLength() const;

  SamplerOptions options_;
  int64_t num_samples_ = 0;
};

}  // namespace cnnflow
