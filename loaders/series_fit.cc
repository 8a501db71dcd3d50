#include "loaders/series_fit.h"

#include <algorithm>
#include <cmath>

#include "loaders/augment.h"
#include "ops/error.h"
#include "ops/random.h"

namespace cnnflow {
namespace {

// One channel: src[0..n) -> dst[0..length) (no standardisation).
void FitChannel(const float* src, int64_t n, int64_t length, SeriesFit fit, int64_t offset,
                float* dst) {
  if (n == 0) {
    std::fill(dst, dst + length, 0.f);
    return;
  }
  if (fit == SeriesFit::kResample) {
    if (n == 1) {
      std::fill(dst, dst + length, src[0]);
      return;
    }
    const double scale =
        length > 1 ? static_cast<double>(n - 1) / static_cast<double>(length - 1) : 0;
    for (int64_t i = 0; i < length; ++i) {
      const double t = length > 1 ? i * scale : (n - 1) / 2.0;
      const int64_t lo = std::min<int64_t>(static_cast<int64_t>(t), n - 1);
      const int64_t hi = std::min<int64_t>(lo + 1, n - 1);
      const double w = t - static_cast<double>(lo);
      dst[i] = static_cast<float>(src[lo] + w * (static_cast<double>(src[hi]) - src[lo]));
    }
    return;
  }
  // pad / crop: a window [offset, offset + length) of the series, zeros past its end.
  const int64_t take = std::min(length, n - offset);
  std::copy(src + offset, src + offset + take, dst);
  std::fill(dst + take, dst + length, 0.f);
}

}  // namespace

Schema AddSeriesFitParams(Schema schema, const std::string& default_fit) {
  schema
      .Choice("fit", {"pad", "crop", "resample"}, default_fit,
              "series longer or shorter than `length`: pad (zeros at the end; a longer series "
              "keeps its start), crop (centre window in evaluation, random window in training; "
              "zeros at the end of a shorter one), resample (linear interpolation to `length`)")
      .Choice("standardize", {"none", "per_sample"}, "none",
              "per_sample: z-normalise each channel of each sample (over the whole series, "
              "before fitting)");
  return schema;
}

SeriesOptions SeriesOptionsFromArgs(const Args& args) {
  SeriesOptions o;
  const std::string& fit = args.String("fit");
  if (fit == "pad") {
    o.fit = SeriesFit::kPad;
  } else if (fit == "crop") {
    o.fit = SeriesFit::kCrop;
  } else if (fit == "resample") {
    o.fit = SeriesFit::kResample;
  } else {
    throw ConfigError(StrCat("fit must be pad, crop or resample, got '", fit, "'"));
  }
  const std::string& standardize = args.String("standardize");
  if (standardize != "none" && standardize != "per_sample") {
    throw ConfigError(StrCat("standardize must be none or per_sample, got '", standardize, "'"));
  }
  o.standardize = standardize == "per_sample";
  return o;
}

int64_t SeriesCropOffset(int64_t src_len, int64_t length, const ReadContext& ctx, int64_t index) {
  const int64_t range = src_len - length;
  if (range <= 0) return 0;
  if (!ctx.train) return range / 2;
  const uint64_t key = StreamKey(ctx.seed, static_cast<uint64_t>(ctx.epoch),
                                 static_cast<uint64_t>(index), kAugmentStream);
  return std::min(range, static_cast<int64_t>(UniformAt(key, 0) * static_cast<double>(range + 1)));
}

void FitSeries(const float* src, int64_t channels, int64_t src_len, const SeriesOptions& o,
               const ReadContext& ctx, int64_t index, float* dst) {
  CNNFLOW_ENFORCE(o.length > 0 && channels > 0 && src_len >= 0, "FitSeries: bad sizes: ", channels,
                  " channels, ", src_len, " -> ", o.length);
  int64_t offset = 0;
  if (o.fit == SeriesFit::kCrop) offset = SeriesCropOffset(src_len, o.length, ctx, index);
  for (int64_t c = 0; c < channels; ++c) {
    const float* s = src + c * src_len;
    float* d = dst + c * o.length;
    FitChannel(s, src_len, o.length, o.fit, offset, d);
    if (!o.standardize || src_len == 0) continue;
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < src_len; ++i) sum += s[i];
    const double mean = sum / static_cast<double>(src_len);
    for (int64_t i = 0; i < src_len; ++i) sq += (s[i] - mean) * (s[i] - mean);
    const double sd = std::sqrt(sq / static_cast<double>(src_len));
    const double inv = sd > 1e-8 ? 1.0 / sd : 1.0;
    // The values that came from the series; the padding stays 0 (= the mean).
    const int64_t real =
        o.fit == SeriesFit::kResample ? o.length : std::min(o.length, src_len - offset);
    for (int64_t i = 0; i < real; ++i) d[i] = static_cast<float>((d[i] - mean) * inv);
  }
}

}  // namespace cnnflow
