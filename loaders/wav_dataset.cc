#include "loaders/wav_dataset.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <regex>
#include <set>

#include "loaders/folder_dataset.h"
#include "loaders/source_registry.h"
#include "loaders/wav.h"
#include "ops/error.h"

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

}  // namespace

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
