#include "loaders/series_dataset.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <regex>
#include <set>

#include "loaders/augment.h"
#include "loaders/folder_dataset.h"
#include "loaders/source_registry.h"
#include "loaders/wav.h"
#include "ops/error.h"
#include "ops/random.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

std::regex CompileRegex(const std::string& pattern, const char* what) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw ConfigError(
        StrCat(what, " '", pattern, "' is not a valid regular expression: ", e.what()));
  }
}

bool ParseInteger(const std::string& s, int64_t* v) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
  return !s.empty() && r.ec == std::errc() && r.ptr == s.data() + s.size();
}

bool EndsWithWav(const std::string& name) {
  if (name.size() < 4) return false;
  std::string ext = name.substr(name.size() - 4);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == ".wav";
}

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

// ---- ts ----

TsDataset::TsDataset(TsFile file, SeriesOptions options, int num_classes)
    : file_(std::move(file)), options_(options) {
  const int64_t found = static_cast<int64_t>(file_.class_labels.size());
  num_classes_ = static_cast<int>(num_classes > 0 ? num_classes : found);
  if (num_classes_ < found) {
    throw ConfigError(StrCat(".ts file '", file_.path, "' lists ", found,
                             " class labels but num_classes is ", num_classes_));
  }
  if (options_.length < 0) {
    throw ConfigError(
        StrCat(".ts file '", file_.path, "': length must be >= 0, got ", options_.length));
  }
  if (options_.length == 0) options_.length = file_.max_length();
  if (options_.length <= 0) {
    throw ConfigError(StrCat(".ts file '", file_.path, "' has only empty series; give length"));
  }
}

TsDataset::TsDataset(const Args& args)
    : TsDataset(
          ReadTsFile(args.String("path")),
          [&] {
            SeriesOptions o = SeriesOptionsFromArgs(args);
            o.length = args.Int("length");
            return o;
          }(),
          static_cast<int>(args.Int("num_classes"))) {}

ReadResult TsDataset::Read(int64_t index, const ReadContext& ctx, float* dst) const {
  CNNFLOW_ENFORCE(index >= 0 && index < size(), ".ts file '", file_.path, "': sample ", index,
                  " out of range [0, ", size(), ")");
  FitSeries(file_.cases[index].data(), file_.channels, file_.lengths[index], options_, ctx, index,
            dst);
  return {file_.labels[index], ""};
}

std::string TsDataset::Key(int64_t index) const { return StrCat(file_.path, " case ", index); }

std::string TsDataset::description() const {
  return StrCat(".ts file ", file_.path, " (", size(), " series of length ", file_.min_length(),
                file_.min_length() == file_.max_length() ? "" : StrCat("..", file_.max_length()),
                ", samples of ", sample_shape(), ", ", num_classes_, " classes)");
}

// ---- wav ----

WavFolder ScanWavFolder(const std::string& root, const std::string& label_regex,
                        const std::string& select) {
  const std::regex label_re = CompileRegex(label_regex, "label_regex");
  const std::regex select_re = CompileRegex(select.empty() ? std::string() : select, "select");
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    throw Error(StrCat("WAV folder '", root, "': ", ec ? ec.message() : "not a directory"));
  }
  std::vector<std::string> names;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (EndsWithWav(name) && !it->is_directory()) names.push_back(name);
  }
  if (ec) throw Error(StrCat("WAV folder '", root, "': cannot list: ", ec.message()));
  if (names.empty()) throw Error(StrCat("WAV folder '", root, "' holds no .wav files"));
  std::sort(names.begin(), names.end());

  std::vector<std::string> class_of(names.size());
  std::set<std::string> distinct;
  for (size_t i = 0; i < names.size(); ++i) {
    std::smatch m;
    if (!std::regex_search(names[i], m, label_re)) {
      throw Error(StrCat("WAV folder '", root, "': label_regex '", label_regex,
                         "' does not match the file name '", names[i], "'"));
    }
    class_of[i] = m.size() > 1 ? m[1].str() : m[0].str();
    distinct.insert(class_of[i]);
  }
  WavFolder f;
  f.root = root;
  f.classes.assign(distinct.begin(), distinct.end());
  const bool numeric = std::all_of(f.classes.begin(), f.classes.end(), [](const std::string& s) {
    int64_t v = 0;
    return ParseInteger(s, &v);
  });
  if (numeric) {
    std::stable_sort(f.classes.begin(), f.classes.end(),
                     [](const std::string& a, const std::string& b) {
                       int64_t x = 0, y = 0;
                       ParseInteger(a, &x);
                       ParseInteger(b, &y);
                       return x < y;
                     });
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (!select.empty() && !std::regex_search(names[i], select_re)) continue;
    f.paths.push_back((fs::path(root) / names[i]).string());
    f.labels.push_back(std::find(f.classes.begin(), f.classes.end(), class_of[i]) -
                       f.classes.begin());
  }
  if (f.paths.empty()) {
    throw ConfigError(StrCat("WAV folder '", root, "': select '", select, "' matches none of its ",
                             names.size(), " .wav files"));
  }
  return f;
}

WavDataset::WavDataset(const Args& args)
    : folder_(
          ScanWavFolder(args.String("path"), args.String("label_regex"), args.String("select"))),
      options_(SeriesOptionsFromArgs(args)) {
  const int64_t found = static_cast<int64_t>(folder_.classes.size());
  const int64_t given = args.Int("num_classes");
  num_classes_ = static_cast<int>(given > 0 ? given : found);
  if (num_classes_ < found) {
    throw ConfigError(StrCat("WAV folder '", folder_.root, "' has ", found,
                             " classes but num_classes is ", num_classes_));
  }
  options_.length = args.Int("length");
  if (options_.length < 0) {
    throw ConfigError(
        StrCat("WAV folder '", folder_.root, "': length must be >= 0, got ", options_.length));
  }
  if (options_.length == 0) {  // the longest file: every header is read once
    std::vector<uint8_t> bytes;
    for (const std::string& path : folder_.paths) {
      std::string error = ReadWholeFile(path, &bytes);
      WavInfo info;
      if (error.empty()) error = DecodeWav(bytes.data(), bytes.size(), &info, nullptr);
      if (!error.empty()) throw Error(StrCat("WAV '", path, "': ", error));
      options_.length = std::max(options_.length, info.frames);
    }
    if (options_.length == 0) {
      throw ConfigError(
          StrCat("WAV folder '", folder_.root, "' holds only empty files; give length"));
    }
  }
}

ReadResult WavDataset::Read(int64_t index, const ReadContext& ctx, float* dst) const {
  const std::string& path = folder_.paths.at(static_cast<size_t>(index));
  thread_local std::vector<uint8_t> bytes;
  thread_local std::vector<float> samples;
  std::string error = ReadWholeFile(path, &bytes);
  if (!error.empty()) return {-1, error};
  WavInfo info;
  error = DecodeWav(bytes.data(), bytes.size(), &info, &samples);
  if (!error.empty()) return {-1, StrCat("WAV '", path, "': ", error)};
  FitSeries(samples.data(), 1, info.frames, options_, ctx, index, dst);
  return {folder_.labels[index], ""};
}

std::string WavDataset::Key(int64_t index) const {
  return folder_.paths.at(static_cast<size_t>(index));
}

std::string WavDataset::description() const {
  return StrCat("WAV folder ", folder_.root, " (", size(), " files, samples of ", sample_shape(),
                ", ", num_classes_, " classes)");
}

CNNFLOW_REGISTER_SOURCE(
    ts,
    AddSeriesFitParams(
        Schema("A UCR/UEA .ts file (sktime's format: @header, then per line channels split by ':', "
               "values by ',', the class label last; `?` = missing, interpolated) -> samples "
               "[C, length], the label = its index in @classLabel.")
            .Required("path", ParamType::kString, "the .ts file")
            .Optional("length", ParamType::kInt, int64_t{0},
                      "sample length (0: the longest series)")
            .Optional("num_classes", ParamType::kInt, int64_t{0}, "0: the @classLabel count"),
        "pad"),
    [](const Args& a) -> std::shared_ptr<Dataset> { return std::make_shared<TsDataset>(a); });

CNNFLOW_REGISTER_SOURCE(
    wav,
    AddSeriesFitParams(
        Schema(
            "A folder of 16-bit PCM .wav files (stereo is averaged to mono) -> samples [1, length] "
            "in [-1, 1); the class from the file name (label_regex), the split by select.")
            .Required("path", ParamType::kString, "the folder of .wav files")
            .Optional("label_regex", ParamType::kString, std::string("^([^_]+)_"),
                      "searched in each file name: the first capture group is the class "
                      "(classes sorted as numbers if all are integers, else by name, over all "
                      "the folder's files)")
            .Optional("select", ParamType::kString, std::string(),
                      "keep the files whose name this regex matches (empty: all); FSDD's usual "
                      "split: test '_[0-4]\\.wav$', train '_([5-9]|[1-9][0-9]+)\\.wav$'")
            .Optional("length", ParamType::kInt, int64_t{0},
                      "sample length in samples (0: the longest file)")
            .Optional("num_classes", ParamType::kInt, int64_t{0}, "0: the classes found"),
        "crop"),
    [](const Args& a) -> std::shared_ptr<Dataset> { return std::make_shared<WavDataset>(a); });

}  // namespace cnnflow
