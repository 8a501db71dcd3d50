// A data set: random access to labelled samples by index. Sources (IDX,
// and later LMDB, image folders, series) implement it; the sampler picks
// the indices and the loader stages copy samples into pooled batches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/error.h"
#include "ops/shape.h"

namespace cnnflow {

struct AugmentOptions;  // loaders/augment.h

// A decoded image before augmentation, HWC uint8 [h, w, c], as the
// augmenter reads it.
struct DecodedImage {
  std::vector<uint8_t> hwc;
  int h = 0, w = 0, c = 0;
};

// What a read may depend on: augmentation is seeded by (seed, epoch,
// sample index) and happens only in training passes.
struct ReadContext {
  uint64_t seed = 0;
  int64_t epoch = 0;
  bool train = true;
  // Set by the one decode of a device-resident copy (data.device_resident):
  // the image sources leave the decoded image here instead of augmenting
  // it (dst is not written); other sources ignore it.
  DecodedImage* decoded = nullptr;
};

// The outcome of reading one sample. A bad record (corrupt JPEG, short
// value, label out of range) is a value, not an exception: the loader
// stage decides to skip or fail (`on_bad_record`).
struct ReadResult {
  int64_t label = -1;
  std::string error;  // empty: ok
  bool ok() const { return error.empty(); }
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Every sample's shape, [C, H, W] or [C, L].
  virtual Shape sample_shape() const = 0;
  virtual int num_classes() const = 0;
  // Writes sample `index` as floats (before normalisation, unless
  // FuseNormalize took it) into dst (sample_shape().numel() values). Safe
  // to call from many threads at once.
  virtual ReadResult Read(int64_t index, const ReadContext& ctx, float* dst) const = 0;
  // Asks Read to normalise as it writes, bitwise as SampleTransform does
  // with this mean and std: a pass over each sample saved (a 224x224 photo
  // is 600 KB of floats). Returns whether Read now does; a source that
  // cannot leaves it to the caller. Not concurrent with Read.
  virtual bool FuseNormalize(const std::vector<double>& mean, const std::vector<double>& std) {
    (void)mean;
    (void)std;
    return false;
  }
  // Whether a FuseNormalize took it.
  virtual bool normalizes() const { return false; }
  // The training passes' augmentation of an image source (whose Read
  // honours ReadContext::decoded); null for the others.
  virtual const AugmentOptions* train_augment() const { return nullptr; }
  // The record's name in the source (an LMDB key, a file), for reports.
  virtual std::string Key(int64_t index) const { return StrCat("#", index); }
  // Where the data comes from, for messages.
  virtual std::string description() const = 0;
};

}  // namespace cnnflow
