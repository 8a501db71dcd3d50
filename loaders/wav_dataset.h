// The `wav` source: samples [1, L] from a folder of 16-bit PCM WAV files
// (wav.h), each read when sampled, the class taken from the file name by a
// regex, a split chosen by another regex on the file name, fitted to the
// sample length (series_fit.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loaders/dataset.h"
#include "loaders/series_fit.h"
#include "ops/schema.h"

namespace cnnflow {

// The files of a WAV folder chosen for one split, with their classes.
struct WavFolder {
  std::string root;
  // The class names found in the names of ALL the folder's .wav files
  // (before `select`, so every split of a folder numbers its classes the
  // same): sorted as numbers if all are integers, else by name.
  std::vector<std::string> classes;
  std::vector<std::string> paths;  // the selected files, sorted by name
  std::vector<int64_t> labels;     // index into classes
};

// Lists root's *.wav files (case-insensitive extension; sub-folders are not
// entered). label_regex is searched in each file name (ECMAScript syntax):
// its first capture group (or the whole match, without a group) is the
// class name; a file it does not match is an Error naming the file.
// `select` (empty: all files) keeps the files whose name it matches.
// ConfigError for a bad regex or a split with no files; Error for a missing
// folder or one without .wav files.
WavFolder ScanWavFolder(const std::string& root, const std::string& label_regex,
                        const std::string& select);

// The `wav` source: [1, length] mono samples in [-1, 1).
class WavDataset : public Dataset {
 public:
  // Args of the `wav` schema (path, label_regex, select, length, fit,
  // standardize, num_classes). length 0 reads every file's header at open
  // and takes the longest.
  explicit WavDataset(const Args& args);

  int64_t size() const override { return static_cast<int64_t>(folder_.paths.size()); }
  Shape sample_shape() const override { return Shape{1, options_.length}; }
  int num_classes() const override { return num_classes_; }
  // Reads and decodes the file; a bad file is a ReadResult error naming it.
  ReadResult Read(int64_t index, const ReadContext& ctx, float* dst) const override;
  std::string Key(int64_t index) const override;
  std::string description() const override;

  const WavFolder& folder() const { return folder_; }

 private:
  WavFolder folder_;
  SeriesOptions options_;
  int num_classes_ = 0;
};

}  // namespace cnnflow
