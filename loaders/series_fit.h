// Series fitted to the sample length, shared by the 1D sources: `ts`
// (ts_dataset.h), `wav` (wav_dataset.h) and `lmdb` for records of f32
// [C, L] (as `cnnflow convert --from ts|wav` writes them) bring every series
// to the sample length with the same FitSeries, so a converted copy gives
// the same samples as the direct source.
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
#include <string>

#include "loaders/dataset.h"
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

}  // namespace cnnflow
