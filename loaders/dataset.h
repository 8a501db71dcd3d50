// A data set: random access to labelled samples by index. Sources (IDX,
// and later LMDB, image folders, series) implement it; the sampler picks
// the indices and the loader stages copy samples into pooled batches.
#pragma once

#include <cstdint>
#include <string>

#include "ops/shape.h"

namespace cnnflow {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Every sample's shape, [C, H, W] or [C, L].
  virtual Shape sample_shape() const = 0;
  virtual int num_classes() const = 0;
  // Writes sample `index` as floats in [0, 1] (before normalisation) into
  // dst (sample_shape().numel() values) and returns its label. Safe to call
  // from many threads at once.
  virtual int64_t Read(int64_t index, float* dst) const = 0;
  // Where the data comes from, for messages.
  virtual std::string description() const = 0;
};

}  // namespace cnnflow
