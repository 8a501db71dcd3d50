// 1D data sources: samples [C, L] from real series files.
//   `ts`:  a UCR/UEA `.ts` file (ts_format.h), held in memory;
//   `wav`: a folder of 16-bit PCM WAV files (wav.h), each read when sampled,
//          the class taken from the file name by a regex, a split chosen by
//          another regex on the file name.
// Both, and the `lmdb` source for records of f32 [C, L] (as `cnnflow
// convert --from ts|wav` writes them), bring every series to the sample
// length with the same FitSeries, so a converted copy gives the same
// samples as the direct source.
//
// Fitting a series of length L to `length` (per channel):
//   pad:      zeros appended at the end; a longer series keeps its first
//             `length` values.
//   crop:     a window of `length`: centred in evaluation, at a uniform
//             random offset in training (a pure function of (seed, epoch,
//             sample index), stream kAugmentStream, as the image augmenter);
//             a shorter series is zero-padded at the end as with pad.
//   resample: linear interpolation to `length` points, the first and last
//             points kept (position i * (L - 1) / (length - 1)).
// standardize per_sample z-normalises each channel over the whole series
// before it is fitted (padding zeros then sit at the channel's mean); a
// constant channel only has its mean removed. The data transform's
// `normalize` applies afterwards, as for images.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loaders/dataset.h"
#include "loaders/ts_format.h"
#include "ops/schema.h"

namespace cnnflow {

enum class SeriesFit { kPad, kCrop, kResample };

struct SeriesOptions {
  int64_t length = 0;  // the sample length (> 0 once resolved)
  SeriesFit fit = SeriesFit::kPad;
  bool standardize = false;  // per-sample, per-channel z-normalisation
};

// Adds `fit` (pad | crop | resample, default `default_fit`) and
// `standardize` (none | per_sample) to a source's schema.
Schema AddSeriesFitParams(Schema schema, const std::string& default_fit);
// Reads them back (length left 0: the source sets it). ConfigError for an
// unknown value.
SeriesOptions SeriesOptionsFromArgs(const Args& args);

// The offset of the `length` window in a series of src_len > length values:
// centred ((src_len - length) / 2) unless ctx.train, else uniform in
// [0, src_len - length] drawn from StreamKey(seed, epoch, index,
// kAugmentStream) (counter 0). 0 when src_len <= length.
int64_t SeriesCropOffset(int64_t src_len, int64_t length, const ReadContext& ctx, int64_t index);

// src: [channels, src_len] -> dst: [channels, options.length], fitted and
// standardised as the options say (see the top of this file). src_len may
// be 0 (dst is all zeros).
void FitSeries(const float* src, int64_t channels, int64_t src_len, const SeriesOptions& options,
               const ReadContext& ctx, int64_t index, float* dst);

// The `ts` source.
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
