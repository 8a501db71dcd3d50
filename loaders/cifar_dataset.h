// The `cifar` data source: the official CIFAR-10 and CIFAR-100 binary
// batches (https://www.cs.toronto.edu/~kriz/cifar.html, "binary version"),
// read as they ship, with no conversion step:
//   CIFAR-10  data_batch_1..5.bin, test_batch.bin: records of 1 label byte
//             + 3072 pixel bytes (1024 R, 1024 G, 1024 B; rows of 32), 10000
//             records a file;
//   CIFAR-100 train.bin, test.bin: records of 2 label bytes (coarse, fine)
//             + the same 3072 pixel bytes.
// The files are read whole at open (CIFAR-10's train split is 154 MB) and
// kept as HWC uint8, the augmenter's input; each read augments a sample
// exactly as the image sources do (the shared ImageSampleDecoder), so a
// record equals the `folder` source's sample of the same pixels. A file
// whose size is not a whole number of records fails at open, naming the
// file and the offset of the partial record; a label out of range is a
// ReadResult error naming the file and the record (on_bad_record decides).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loaders/dataset.h"
#include "loaders/image_dataset.h"
#include "ops/schema.h"

namespace cnnflow {

enum class CifarFormat { kCifar10, kCifar100 };

class CifarDataset : public ImageDataset {
 public:
  static constexpr int kSide = 32;
  static constexpr int64_t kPixels = 3 * kSide * kSide;  // 3072 bytes, CHW

  // Args of the `cifar` source schema (path, split, format, label,
  // num_classes and the augmentation parameters). Throws Error naming the
  // file for a missing file, a partial record or an undecidable format.
  explicit CifarDataset(const Args& args);

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  Shape sample_shape() const override { return Shape{3, kSide, kSide}; }
  int num_classes() const override { return num_classes_; }
  // [3, 32, 32] floats in [0, 1] (or normalised once FuseNormalize took it).
  ReadResult Read(int64_t index, const ReadContext& ctx, float* dst) const override;
  // "<file> record <r> (offset <byte>)".
  std::string Key(int64_t index) const override;
  std::string description() const override;

  CifarFormat format() const { return format_; }
  const std::vector<std::string>& files() const { return files_; }
  // Record `index`'s pixels as HWC uint8 [32, 32, 3], and its label.
  const uint8_t* hwc(int64_t index) const { return pixels_.data() + index * kPixels; }
  int64_t label(int64_t index) const { return labels_.at(static_cast<size_t>(index)); }

 private:
  std::string path_;
  CifarFormat format_ = CifarFormat::kCifar10;
  bool coarse_ = false;
  int num_classes_ = 0;
  std::vector<std::string> files_;
  std::vector<int64_t> file_start_;  // the first record of each file
  std::vector<uint8_t> pixels_;      // HWC, kPixels a record
  std::vector<uint8_t> labels_;
};

// The bytes of one record: 3073 (CIFAR-10) or 3074 (CIFAR-100).
int64_t CifarRecordBytes(CifarFormat format);

}  // namespace cnnflow
