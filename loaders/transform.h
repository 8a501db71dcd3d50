// Per-sample transforms applied by the loader after a sample is read:
// per-channel normalisation now; augmentation comes with the image loaders.
#pragma once

#include <vector>

#include "ops/shape.h"

namespace cnnflow {

class SampleTransform {
 public:
  // x = (x - mean[c]) / std[c] in float, subtract then divide as
  // torchvision's Normalize; one value applies to every channel.
  void AddNormalize(std::vector<double> mean, std::vector<double> std);
  // Transforms one sample of `shape` ([C, ...]) in place.
  void Apply(float* sample, const Shape& shape) const;
  bool empty() const { return mean_.empty(); }

 private:
  std::vector<double> mean_, std_;
};

}  // namespace cnnflow
