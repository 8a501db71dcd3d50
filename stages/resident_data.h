// data.device_resident: a training set held on the GPUs. Decoded once by
// the set's own loader (the image sources' ReadContext::decoded), uploaded
// to each GPU replica's device as uint8 [N, C, H, W]
// (ops/cuda/resident_set.h), and each step's rows made there from the
// sample ids and the loader's own draws (loaders/augment.h DrawCropFlip),
// so the same config gives the same pixels as the CPU loader. load_batch
// then reads only the labels, and forward_backward makes each GPU
// replica's rows on its GPU instead of staging pixels through pinned
// memory.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loaders/augment.h"
#include "loaders/dataset.h"
#include "ops/cuda/resident_set.h"
#include "ops/device.h"
#include "ops/tensor.h"

namespace cnnflow {

class ResidentData {
 public:
  // Which data set ("train") it holds.
  const std::string& name() const { return name_; }
  int64_t label(int64_t sample) const { return labels_[static_cast<size_t>(sample)]; }
  // Why `sample` could not be decoded ("" for a good one): load_batch
  // applies data.on_bad_record when it is drawn, as to a record it reads.
  std::string BadRecord(int64_t sample) const {
    const auto it = bad_.find(sample);
    return it == bad_.end() ? std::string() : it->second;
  }
  // Rows [n, C, out_h, out_w] (f32, NCHW) of samples ids[0..n) for `epoch`
  // on GPU `device` (one of those it was uploaded to), issued on that
  // device's compute stream.
  Tensor MakeBatch(Device device, const int64_t* ids, int64_t n, uint64_t seed,
                   int64_t epoch) const;
  size_t bytes() const { return pixels_bytes_; }

  // What Make found: the set, or why not (one line for the run's output),
  // and the one decode's seconds.
  struct Made {
    std::shared_ptr<const ResidentData> data;
    std::string why_not;
    double decode_seconds = 0;
    double upload_seconds = 0;
  };
  // Decodes `data` (named `name`) with `threads` threads and uploads it to
  // each of `gpus`, where its augmentation is one the GPU makes
  // (CropFlipUnsupported), every image has one size, and the pixels take
  // at most half of each GPU's free memory. normalized_by_set: the source
  // applies the run's normalize transform itself (or there is none). A
  // record that does not decode is kept as zeros and noted (BadRecord);
  // Make throws only when no record decodes.
  static Made Make(const std::string& name, const Dataset& data, bool normalized_by_set,
                   const std::vector<Device>& gpus, int threads);

 private:
  std::string name_;
  AugmentOptions options_;
  ResidentImages::BatchFormat format_;
  std::vector<int64_t> labels_;
  std::map<int64_t, std::string> bad_;  // sample -> why it did not decode
  size_t pixels_bytes_ = 0;
  std::map<int, std::unique_ptr<ResidentImages>> on_gpu_;  // by GPU index
};

}  // namespace cnnflow
