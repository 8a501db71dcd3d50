// The `folder` data source: trains straight from an image folder laid out
// as torchvision's ImageFolder (root/<class>/<image>, classes and files
// sorted by name: image_folder.h), with no conversion step. Each read loads
// the file with plain read() into a per-thread buffer, decodes it (JPEG or
// PNG by its magic bytes) and augments it exactly as the `lmdb` source does
// (the same ImageSampleDecoder), so `folder` and `lmdb` over a converted
// copy of the folder give the same samples. A file that cannot be read or
// decoded is a ReadResult error naming the file.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loaders/dataset.h"
#include "loaders/image_dataset.h"
#include "loaders/image_folder.h"
#include "ops/schema.h"

namespace cnnflow {

class FolderDataset : public ImageDataset {
 public:
  // Args of the `folder` source schema (path, shape, num_classes, pad,
  // pad_mode, random_crop, hflip, resize_min_side). Scans the folder (Error naming
  // the path if it is missing, empty or has an empty class); without
  // `shape` the first image's header gives [C, H, W].
  explicit FolderDataset(const Args& args);

  int64_t size() const override { return static_cast<int64_t>(folder_.entries.size()); }
  Shape sample_shape() const override { return shape_; }
  int num_classes() const override { return num_classes_; }
  // [C, H, W] floats in [0, 1] (normalisation is the data transform's).
  ReadResult Read(int64_t index, const ReadContext& ctx, float* dst) const override;
  // The image file's path.
  std::string Key(int64_t index) const override;
  std::string description() const override;

  const ImageFolder& folder() const { return folder_; }

 private:
  std::string root_;
  ImageFolder folder_;
  Shape shape_;
  int num_classes_ = 0;
};

// Reads the whole file at `path` into *bytes (resized to fit) with open /
// fstat / read. Returns "" or an error naming the path and the errno text.
std::string ReadWholeFile(const std::string& path, std::vector<uint8_t>* bytes);

}  // namespace cnnflow
