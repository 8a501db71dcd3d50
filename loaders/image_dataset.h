// The base of the image sources whose samples go through an
// ImageSampleDecoder (`folder`, `cifar`): the data transform's normalize is
// fused into the decoder's augment, one pass over each sample.
#pragma once

#include <memory>
#include <vector>

#include "loaders/dataset.h"
#include "loaders/image_decoder.h"

namespace cnnflow {

class ImageDataset : public Dataset {
 public:
  bool FuseNormalize(const std::vector<double>& mean, const std::vector<double>& std) override {
    return decoder_->FuseNormalize(mean, std);
  }
  bool normalizes() const override { return decoder_->normalizes(); }
  const AugmentOptions* train_augment() const override { return &decoder_->train_options(); }

 protected:
  std::unique_ptr<ImageSampleDecoder> decoder_;  // made by the source's constructor
};

}  // namespace cnnflow
