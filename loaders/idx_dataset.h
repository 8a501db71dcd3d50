// The IDX format of MNIST and Fashion-MNIST, gzip-compressed or plain:
// a big-endian header (magic 0x00000803 + [n, rows, cols] for uint8 images,
// 0x00000801 + [n] for uint8 labels) followed by the raw bytes. The whole
// set is kept in memory as uint8 (Fashion-MNIST's 60000 x 28 x 28 is 47 MB).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loaders/dataset.h"

namespace cnnflow {

class IdxDataset : public Dataset {
 public:
  // Reads both files (gzip or plain). Throws Error naming the file for a
  // missing file, a bad magic (found and expected), truncated data
  // (expected and got bytes), or image and label counts that differ.
  static std::unique_ptr<IdxDataset> Open(const std::string& images_path,
                                          const std::string& labels_path);

  int64_t size() const override { return size_; }
  // [1, rows, cols].
  Shape sample_shape() const override { return Shape{1, rows_, cols_}; }
  // The largest label + 1 (at least 1).
  int num_classes() const override { return num_classes_; }
  // dst: rows * cols floats, pixel / 255. Returns the label.
  ReadResult Read(int64_t index, const ReadContext& ctx, float* dst) const override;
  std::string description() const override;

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  // Sample i's raw pixels (rows * cols bytes) and label, for fast paths.
  const uint8_t* pixels(int64_t i) const { return pixels_.data() + i * rows_ * cols_; }
  int64_t label(int64_t i) const { return labels_[i]; }

 private:
  IdxDataset() = default;
  std::string images_path_, labels_path_;
  int64_t size_ = 0, rows_ = 0, cols_ = 0;
  int num_classes_ = 1;
  std::vector<uint8_t> pixels_;
  std::vector<uint8_t> labels_;
};

}  // namespace cnnflow
