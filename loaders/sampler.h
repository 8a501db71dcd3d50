// Which sample indices each data-parallel rank reads in an epoch, as torch's
// DistributedSampler does: one permutation per epoch, seeded by (seed,
// epoch) only, so every rank computes the same one without talking; rank r
// takes positions r, r + world, r + 2 world, ... (or blocks of them, see
// SamplerOptions::block). Together the ranks cover the data set; the shards
// are disjoint unless padding was needed.
#pragma once

#include <cstdint>
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
  // blocks (block: the samples of one rank's batch; the last, short run is
  // cut in world_size equal parts). So the global batch of a step is the
  // same run of the order however many processes share it, and each global
  // replica trains on the same rows as in one process with all replicas
  // (the all-reduce's tree order does the rest: mpirun -np 2 equals two
  // replicas in one process bit for bit).
  int64_t block = 0;
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
  // or cut to a multiple of world_size (unless uneven), then every
  // world_size-th position from rank (or its blocks).
  std::vector<int64_t> EpochIndices(int64_t epoch) const;
  // Per rank per epoch.
  int64_t num_samples() const { return num_samples_; }
  const SamplerOptions& options() const { return options_; }

  // Batches in an epoch of num_samples: ceil, or floor when the last
  // partial batch is dropped.
  static int64_t NumBatches(int64_t num_samples, int64_t batch, bool drop_last_batch);

 private:
  SamplerOptions options_;
  int64_t num_samples_ = 0;
};

}  // namespace cnnflow
