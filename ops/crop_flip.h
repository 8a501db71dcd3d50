// The crop, flip and padding of a uint8 image into a normalised float
// sample, written one destination pixel at a time: the arithmetic that the
// device-resident data set's GPU kernel (ops/cuda/resident_set.h) and its
// CPU reference share, so the two cannot drift. The draws come from the
// loader's own DrawAugmentParams (loaders/augment.h), and the reference
// below gives the CPU loader's pixels bitwise (tests/loaders/augment_test.cc),
// so a batch made on the GPU is the batch the CPU loader makes.
//
// Source:      uint8 [C, H, W] (one image of the resident set).
// Padding:     `pad` pixels on every side, zeros or mirrored without
//              repeating the edge pixel (numpy.pad 'reflect').
// Crop:        rows [top, top + out_h), columns [left, left + out_w) of the
//              padded image, then mirrored left-right if flip.
// Normalise:   out = (v / 255 - mean[c]) / std[c], each step rounded to
//              float (no fused multiply-add is possible: a division, a
//              subtraction, a division), as the loader's table.
// Header-only, host and device (nvcc compiles it into the kernel).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define CNNFLOW_CROP_FLIP_HD __host__ __device__ __forceinline__
#else
#define CNNFLOW_CROP_FLIP_HD inline
#endif

namespace cnnflow {

// One sample's draw as the GPU takes it (a small POD array copied per
// batch): which image of the set, and where its crop starts.
struct CropFlipDraw {
  int32_t image = 0;  // row of the resident set
  int32_t top = 0;    // in padded coordinates
  int32_t left = 0;
  int32_t flip = 0;  // 1: mirrored left-right
};

// The fixed geometry of every sample of a set.
struct CropFlipGeometry {
  int32_t channels = 0;
  int32_t h = 0, w = 0;          // source image
  int32_t out_h = 0, out_w = 0;  // sample
  int32_t pad = 0;
  int32_t reflect = 0;  // 1: reflect padding, else zeros
};

// Index into an n-long axis of padding position i (the image's own pixels
// are 0..n-1): i itself inside; outside, with reflect padding and within
// `pad` of the edge, its mirror about the edge pixel (pad < n keeps it
// inside); else -1, a zero pixel. The same rule as the loader's.
CNNFLOW_CROP_FLIP_HD int PadSourceIndex(int i, int n, int pad, int reflect) {
  if (i >= 0 && i < n) return i;
  if (!reflect || i < -pad || i >= n + pad) return -1;
  return i < 0 ? -i : 2 * (n - 1) - i;
}

// Offset in the source plane [H, W] of destination pixel (y, x) of a
// sample, or -1 where it falls on zero padding.
CNNFLOW_CROP_FLIP_HD int64_t CropFlipSource(const CropFlipGeometry& g, const CropFlipDraw& d, int y,
                                            int x) {
  const int sy = PadSourceIndex(d.top + y - g.pad, g.h, g.pad, g.reflect);
  const int px = d.flip ? g.out_w - 1 - x : x;  // column of the unflipped crop
  const int sx = PadSourceIndex(d.left + px - g.pad, g.w, g.pad, g.reflect);
  if (sy < 0 || sx < 0) return -1;
  return int64_t{sy} * g.w + sx;
}

// The normalised value of byte v in channel c.
CNNFLOW_CROP_FLIP_HD float NormalisePixel(uint8_t v, float mean, float std) {
  return (static_cast<float>(v) / 255.f - mean) / std;
}

// The CPU reference of the GPU kernel: sample [C, out_h, out_w] (or, nhwc,
// [out_h, out_w, C]) of `source` [C, H, W] under draw d. mean and std hold
// one value per channel.
inline void CropFlipReference(const uint8_t* source, const CropFlipGeometry& g,
                              const CropFlipDraw& d, const float* mean, const float* std, bool nhwc,
                              float* out) {
  const int64_t plane = int64_t{g.h} * g.w;
  for (int c = 0; c < g.channels; ++c) {
    for (int y = 0; y < g.out_h; ++y) {
      for (int x = 0; x < g.out_w; ++x) {
        const int64_t s = CropFlipSource(g, d, y, x);
        const uint8_t v = s < 0 ? uint8_t{0} : source[c * plane + s];
        const int64_t at = nhwc ? (int64_t{y} * g.out_w + x) * g.channels + c
                                : (int64_t{c} * g.out_h + y) * g.out_w + x;
        out[at] = NormalisePixel(v, mean[c], std[c]);
      }
    }
  }
}

}  // namespace cnnflow
