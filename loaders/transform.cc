#include "loaders/transform.h"

#include "ops/error.h"

namespace cnnflow {

void SampleTransform::AddNormalize(std::vector<double> mean, std::vector<double> std) {
  CNNFLOW_ENFORCE(!mean.empty() && mean.size() == std.size(),
                  "normalize: mean and std need the same number of values");
  for (double s : std) {
    if (!(s > 0)) throw ConfigError(StrCat("normalize: std must be > 0, got ", s));
  }
  CNNFLOW_ENFORCE(mean_.empty(), "normalize given twice");
  mean_ = std::move(mean);
  std_ = std::move(std);
}

void SampleTransform::Apply(float* x, const Shape& shape) const {
  if (mean_.empty()) return;
  const int64_t channels = shape[0];
  if (mean_.size() != 1 && static_cast<int64_t>(mean_.size()) != channels) {
    throw ConfigError(
        StrCat("normalize has ", mean_.size(), " values, samples have ", channels, " channels"));
  }
  const int64_t plane = shape.numel() / channels;
  for (int64_t c = 0; c < channels; ++c) {
    const size_t k = mean_.size() == 1 ? 0 : static_cast<size_t>(c);
    const float m = static_cast<float>(mean_[k]);
    const float s = static_cast<float>(std_[k]);
    float* p = x + c * plane;
    for (int64_t i = 0; i < plane; ++i) p[i] = (p[i] - m) / s;
  }
}

}  // namespace cnnflow
