#include "loaders/synthetic_dataset.h"

#include <cmath>

#include "loaders/source_registry.h"
#include "ops/error.h"
#include "ops/random.h"

namespace cnnflow {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
// 24 random bits u -> u * kScale - kSqrt3: uniform in [-sqrt 3, sqrt 3),
// variance 1.
constexpr float kSqrt3 = 1.7320508075688772f;
constexpr float kScale = 2.f * kSqrt3 / 16777216.f;

std::string DimsString(const std::vector<int64_t>& dims) { return Shape(dims).ToString(); }

}  // namespace

SyntheticDataset::SyntheticDataset(SyntheticOptions options) : o_(std::move(options)) {
  bool ok = o_.shape.size() == 2 || o_.shape.size() == 3;
  int64_t numel = 1;
  for (int64_t d : o_.shape) {
    ok = ok && d > 0 && !__builtin_mul_overflow(numel, d, &numel) && numel <= (int64_t{1} << 32);
  }
  if (!ok) {
    throw Error(
        StrCat("synthetic: shape must be [C, H, W] or [C, L] with every dim > 0 (and at "
               "most 2^32 values), got ",
               DimsString(o_.shape)));
  }
  if (o_.classes < 1 || o_.classes > (int64_t{1} << 30)) {
    throw Error(StrCat("synthetic: classes must be in [1, 2^30], got ", o_.classes));
  }
  if (o_.size < 1) throw Error(StrCat("synthetic: size must be >= 1 samples, got ", o_.size));
  if (!std::isfinite(o_.separation) || o_.separation < 0) {
    throw Error(StrCat("synthetic: separation must be finite and >= 0, got ", o_.separation));
  }
  shape_ = Shape(o_.shape);
  const auto seed = static_cast<uint64_t>(o_.seed);
  noise_key_ = StreamKey(seed, 0x6e6f697365 /* "noise" */);
  label_key_ = StreamKey(seed, 0x6c6162656c /* "label" */);
}

int64_t SyntheticDataset::Label(int64_t index) const {
  // The high 32 bits of a hash times the class count, >> 32: uniform over
  // [0, classes) without modulo bias worth the name.
  const uint64_t h = Mix64(label_key_ ^ Mix64(static_cast<uint64_t>(index))) >> 32;
  return static_cast<int64_t>((h * static_cast<uint64_t>(o_.classes)) >> 32);
}

float SyntheticDataset::ClassMean(int64_t k, int64_t c) const {
  const int64_t rank = (k + c) % o_.classes;
  return static_cast<float>(o_.separation * static_cast<double>(2 * rank + 1 - o_.classes) /
                            static_cast<double>(o_.classes));
}

ReadResult SyntheticDataset::Read(int64_t index, const ReadContext&, float* dst) const {
  CNNFLOW_ENFORCE(index >= 0 && index < o_.size, "synthetic: sample ", index, " out of range [0, ",
                  o_.size, ")");
  // The data set is fixed, as a real one: values do not depend on the epoch
  // or the pass. One SplitMix64 step per two values (a counter-based stream
  // keyed by the sample), written straight into the batch row.
  const uint64_t key = Mix64(noise_key_ ^ Mix64(static_cast<uint64_t>(index)));
  const int64_t n = shape_.numel();
  const int64_t pairs = n / 2;
  for (int64_t j = 0; j < pairs; ++j) {
    const uint64_t h = Mix64(key + static_cast<uint64_t>(j) * kGolden);
    dst[2 * j] = static_cast<float>(h >> 40) * kScale - kSqrt3;
    dst[2 * j + 1] = static_cast<float>((h >> 8) & 0xffffff) * kScale - kSqrt3;
  }
  if (n % 2) {
    const uint64_t h = Mix64(key + static_cast<uint64_t>(pairs) * kGolden);
    dst[n - 1] = static_cast<float>(h >> 40) * kScale - kSqrt3;
  }
  const int64_t label = Label(index);
  if (o_.separation > 0) {
    const int64_t channels = shape_[0], plane = n / channels;
    for (int64_t c = 0; c < channels; ++c) {
      const float mean = ClassMean(label, c);
      float* p = dst + c * plane;
      for (int64_t e = 0; e < plane; ++e) p[e] += mean;
    }
  }
  return {label, ""};
}

std::string SyntheticDataset::description() const {
  return StrCat("synthetic ", o_.size, " samples of ", shape_, ", ", o_.classes, " classes, seed ",
                o_.seed, ", separation ", o_.separation);
}

CNNFLOW_REGISTER_SOURCE(
    synthetic,
    Schema("Synthetic samples made on the fly, for benchmarks that must not wait on disk or "
           "decoding: sample i is a pure function of (seed, i): unit-variance uniform noise "
           "plus a per-channel mean that depends on its class (channel c of class k: "
           "separation * (2 ((k + c) mod classes) + 1 - classes) / classes), so a model "
           "can learn the labels; the label is a hash of (seed, i).")
        .Required("shape", ParamType::kIntList, "sample shape [C, H, W] or [C, L]")
        .Optional("classes", ParamType::kInt, int64_t{10}, "labels in [0, classes)")
        .Optional("size", ParamType::kInt, int64_t{50000},
                  "samples in the set (no memory is held per sample)")
        .Optional("seed", ParamType::kInt, int64_t{0}, "which data set: same seed, same samples")
        .Optional("separation", ParamType::kFloat, 1.0,
                  "spread of the class means in noise standard deviations (0: pure noise, "
                  "the labels cannot be learned)"),
    [](const Args& a) -> std::shared_ptr<Dataset> {
      SyntheticOptions o;
      o.shape = a.Ints("shape");
      o.classes = a.Int("classes");
      o.size = a.Int("size");
      o.seed = a.Int("seed");
      o.separation = a.Float("separation");
      return std::make_shared<SyntheticDataset>(std::move(o));
    });

}  // namespace cnnflow
