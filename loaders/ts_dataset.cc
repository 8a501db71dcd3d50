#include "loaders/ts_dataset.h"

#include <utility>

#include "loaders/source_registry.h"
#include "ops/error.h"

namespace cnnflow {

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

}  // namespace cnnflow
