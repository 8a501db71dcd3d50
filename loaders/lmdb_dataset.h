// The `lmdb` data source: records of an LMDB (cnnflow's layout or Caffe's
// Datum, as `cnnflow convert` writes them), raw pixels, JPEG or PNG, decoded
// (image_decoder.h: TurboJPEG / libpng) into a per-thread buffer and
// augmented per (seed, epoch, sample) in training passes. Records of raw
// f32 [C, L] series (`cnnflow convert --from ts|wav`, any length each) are
// fitted to the sample length as the `ts` / `wav` sources do
// (series_fit.h: fit, standardize). A record that cannot be read is a
// ReadResult error naming the problem (the loader stage skips or fails).
#pragma once

#include <memory>
#include <string>

#include "loaders/dataset.h"
#include "loaders/image_decoder.h"
#include "loaders/lmdb_store.h"
#include "loaders/series_fit.h"
#include "ops/schema.h"

namespace cnnflow {

class LmdbDataset : public Dataset {
 public:
  // Args of the `lmdb` source schema (path, shape, num_classes, pad,
  // pad_mode, random_crop, hflip, resize_min_side, fit, standardize). Series mode when
  // `shape` is [C, L] or, without shape, the first record is [C, L] (then L
  // = the longest record's). Throws Error naming the path.
  explicit LmdbDataset(const Args& args);

  int64_t size() const override { return reader_.size(); }
  Shape sample_shape() const override { return shape_; }
  int num_classes() const override { return num_classes_; }
  // [C, H, W] floats in [0, 1], or [C, L] series (normalisation is the
  // data transform's).
  ReadResult Read(int64_t index, const ReadContext& ctx, float* dst) const override;
  bool FuseNormalize(const std::vector<double>& mean, const std::vector<double>& std) override {
    return decoder_ != nullptr && !series_ && decoder_->FuseNormalize(mean, std);
  }
  bool normalizes() const override { return decoder_ != nullptr && decoder_->normalizes(); }
  const AugmentOptions* train_augment() const override {
    return decoder_ != nullptr && !series_ ? &decoder_->train_options() : nullptr;
  }
  std::string Key(int64_t index) const override;
  std::string description() const override;

 private:
  LmdbReader reader_;
  Shape shape_;
  int num_classes_ = 0;
  std::unique_ptr<ImageSampleDecoder> decoder_;  // image mode only
  bool series_ = false;
  SeriesOptions series_options_;  // series mode only
};

}  // namespace cnnflow
