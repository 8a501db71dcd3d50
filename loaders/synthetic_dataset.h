// A synthetic data set (`source: synthetic`): samples of any [C, H, W] or
// [C, L] shape made on the fly, for benchmarks that must not wait on disk or
// decoding (the GPU bench) and for machines without the real data. Sample i
// is a pure function of (seed, i): the same whatever thread, order or epoch
// reads it. Values are unit-variance uniform noise plus, per channel, a mean
// offset that depends on the class, so training on it shows a falling loss.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loaders/dataset.h"

namespace cnnflow {

struct SyntheticOptions {
  std::vector<int64_t> shape;  // [C, H, W] or [C, L], every dim > 0
  int64_t classes = 10;        // labels in [0, classes)
  int64_t size = 50000;        // samples
  int64_t seed = 0;
  // The class means of a channel are evenly spaced in (-separation,
  // separation), in noise standard deviations (0: pure noise, the labels
  // cannot be learned).
  double separation = 1.0;
};

class SyntheticDataset : public Dataset {
 public:
  // Throws Error naming the parameter ("synthetic: shape must be ...").
  explicit SyntheticDataset(SyntheticOptions options);

  int64_t size() const override { return o_.size; }
  Shape sample_shape() const override { return shape_; }
  int num_classes() const override { return static_cast<int>(o_.classes); }
  // dst: shape.numel() floats; value e = noise(seed, i, e) + offset(label, e's channel).
  ReadResult Read(int64_t index, const ReadContext& ctx, float* dst) const override;
  std::string description() const override;

  // Sample i's label: a hash of (seed, i), uniform over the classes.
  int64_t Label(int64_t index) const;
  // The mean of channel c's values for class k: separation * (2 * ((k + c)
  // mod classes) + 1 - classes) / classes, evenly spaced in (-separation,
  // separation), shifted per channel so classes differ in every channel.
  float ClassMean(int64_t k, int64_t c) const;

 private:
  SyntheticOptions o_;
  Shape shape_;
  uint64_t noise_key_ = 0, label_key_ = 0;
};

}  // namespace cnnflow
