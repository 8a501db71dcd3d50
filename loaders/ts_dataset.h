// The `ts` source: samples [C, L] from a UCR/UEA `.ts` file (ts_format.h),
// held in memory, fitted to the sample length (series_fit.h).
#pragma once

#include <cstdint>
#include <string>

#include "loaders/dataset.h"
#include "loaders/series_fit.h"
#include "loaders/ts_format.h"
#include "ops/schema.h"

namespace cnnflow {

class TsDataset : public Dataset {
 public:
  // Args of the `ts` schema (path, length, fit, standardize, num_classes).
  // Throws Error from the parser (PATH:LINE: what), ConfigError for bad
  // parameters (naming the file).
  explicit TsDataset(const Args& args);
  // The same from a parsed file (tests, the converter).
  TsDataset(TsFile file, SeriesOptions options, int num_classes = 0);

  int64_t size() const override { return file_.size(); }
  Shape sample_shape() const override { return Shape{file_.channels, options_.length}; }
  int num_classes() const override { return num_classes_; }
  // [C, length] floats; the label is the index into @classLabel.
  ReadResult Read(int64_t index, const ReadContext& ctx, float* dst) const override;
  std::string Key(int64_t index) const override;
  std::string description() const override;

  const TsFile& file() const { return file_; }
  const SeriesOptions& options() const { return options_; }

 private:
  TsFile file_;
  SeriesOptions options_;
  int num_classes_ = 0;
};

}  // namespace cnnflow
