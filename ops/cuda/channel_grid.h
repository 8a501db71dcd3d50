// The grid of our per-channel CUDA kernels over an [n, c, s] tensor (the
// batchnorm kernels, ops/cuda/batch_norm_kernels.h): which values of which
// channel each thread visits. Plain arithmetic, shared by the kernels and a
// host test that checks every value is visited once, in its channel.
//  - channels-last ([n, s, c]): the n * s rows of c values; a block is
//    kTile channels (threadIdx.x, so a warp reads consecutive values) by
//    kTileRows rows; blockIdx.x the channel tile, blockIdx.y the strip of
//    rows it starts;
//  - NCHW ([n, c, s]): a block per channel (blockIdx.x) and strip of
//    samples (blockIdx.y), its kThreads threads along each sample's plane.
// Strips step by the grid's strips, so a channel's values are covered once.
// The grid depends on the shape only (not on the GPU), so sums taken in a
// fixed order over it are the same bits on any GPU.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__CUDACC__)
#define CNNFLOW_CHANNEL_GRID_HD __host__ __device__ __forceinline__
#else
#define CNNFLOW_CHANNEL_GRID_HD inline
#endif

namespace cnnflow::cuda {

struct ChannelGrid {
  static constexpr int kTile = 32;
  static constexpr int kThreads = 256;
  static constexpr int kTileRows = kThreads / kTile;
  static constexpr int64_t kTargetBlocks = 512;  // enough to fill any GPU's SMs a few times
  static constexpr int64_t kMinRowsPerThread = 16;
  static constexpr int64_t kMaxStrips = 1024;

  int64_t n = 0, c = 0, s = 0;
  bool nhwc = false;
  unsigned tiles = 0, strips = 0;  // gridDim.x, gridDim.y

  static ChannelGrid Of(int64_t n, int64_t c, int64_t s, bool nhwc) {
    ChannelGrid g{n, c, s, nhwc, 0, 0};
    const int64_t tiles = nhwc ? (c + kTile - 1) / kTile : c;
    const int64_t most = nhwc ? std::max<int64_t>(1, n * s / (kTileRows * kMinRowsPerThread))
                              : std::max<int64_t>(1, n);
    g.tiles = static_cast<unsigned>(tiles);
    g.strips = static_cast<unsigned>(
        std::clamp<int64_t>((kTargetBlocks + tiles - 1) / tiles, 1, std::min(most, kMaxStrips)));
    return g;
  }
  // Threads per block along x and y.
  unsigned threads_x() const { return nhwc ? kTile : kThreads; }
  unsigned threads_y() const { return nhwc ? kTileRows : 1; }

  // The channel of thread x of block x (>= c: the thread has none).
  CNNFLOW_CHANNEL_GRID_HD int64_t Channel(unsigned block_x, unsigned thread_x) const {
    return nhwc ? static_cast<int64_t>(block_x) * kTile + thread_x : block_x;
  }
  // Calls f(offset) for each value of channel ch that thread (thread_x,
  // thread_y) of a block in strip block_y visits.
  template <typename F>
  CNNFLOW_CHANNEL_GRID_HD void ForEach(int64_t ch, unsigned block_y, unsigned thread_x,
                                       unsigned thread_y, F&& f) const {
    if (nhwc) {
      const int64_t rows = n * s;
      for (int64_t r = static_cast<int64_t>(block_y) * kTileRows + thread_y; r < rows;
           r += static_cast<int64_t>(kTileRows) * strips) {
        f(r * c + ch);
      }
      return;
    }
    for (int64_t i = block_y; i < n; i += strips) {
      const int64_t base = (i * c + ch) * s;
      for (int64_t p = thread_x; p < s; p += kThreads) f(base + p);
    }
  }
};

}  // namespace cnnflow::cuda
