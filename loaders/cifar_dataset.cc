#include "loaders/cifar_dataset.h"

#include <algorithm>
#include <filesystem>

#include "loaders/folder_dataset.h"
#include "loaders/source_registry.h"
#include "ops/error.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

// The format the official file names tell: data_batch_N.bin / test_batch.bin
// are CIFAR-10's, train.bin / test.bin CIFAR-100's.
bool FormatFromName(const std::string& path, CifarFormat* format) {
  const std::string name = fs::path(path).filename().string();
  if (name.rfind("data_batch", 0) == 0 || name.rfind("test_batch", 0) == 0) {
    *format = CifarFormat::kCifar10;
    return true;
  }
  if (name == "train.bin" || name == "test.bin") {
    *format = CifarFormat::kCifar100;
    return true;
  }
  return false;
}

}  // namespace

int64_t CifarRecordBytes(CifarFormat format) {
  return (format == CifarFormat::kCifar10 ? 1 : 2) + CifarDataset::kPixels;
}

CifarDataset::CifarDataset(const Args& args) : path_(args.String("path")) {
  const std::string split = args.String("split");
  const std::string format = args.String("format");
  coarse_ = args.String("label") == "coarse";
  const std::string pre = StrCat("CIFAR '", path_, "': ");

  // The files: a folder of the official batches (by split), or one file.
  std::error_code ec;
  if (fs::is_directory(path_, ec)) {
    const bool has10 = fs::exists(fs::path(path_) / "data_batch_1.bin") ||
                       fs::exists(fs::path(path_) / "test_batch.bin");
    const bool has100 =
        fs::exists(fs::path(path_) / "train.bin") || fs::exists(fs::path(path_) / "test.bin");
    if (format == "cifar10" || (format == "auto" && has10)) {
      format_ = CifarFormat::kCifar10;
    } else if (format == "cifar100" || (format == "auto" && has100)) {
      format_ = CifarFormat::kCifar100;
    } else {
      throw Error(StrCat(pre,
                         "holds neither CIFAR-10's data_batch_1.bin / test_batch.bin nor "
                         "CIFAR-100's train.bin / test.bin"));
    }
    std::vector<std::string> names;
    if (format_ == CifarFormat::kCifar10 && split == "train") {
      for (int b = 1; b <= 5; ++b) names.push_back(StrCat("data_batch_", b, ".bin"));
    } else if (format_ == CifarFormat::kCifar10) {
      names.push_back("test_batch.bin");
    } else {
      names.push_back(split == "train" ? "train.bin" : "test.bin");
    }
    for (const std::string& n : names) {
      const std::string file = (fs::path(path_) / n).string();
      if (!fs::exists(file, ec)) throw Error(StrCat(pre, "no ", n, " (the ", split, " split)"));
      files_.push_back(file);
    }
  } else {
    if (!fs::exists(path_, ec)) throw Error(StrCat(pre, "no such file or folder"));
    files_.push_back(path_);
    if (format == "cifar10") {
      format_ = CifarFormat::kCifar10;
    } else if (format == "cifar100") {
      format_ = CifarFormat::kCifar100;
    } else if (!FormatFromName(path_, &format_)) {
      throw Error(StrCat(pre,
                         "cannot tell CIFAR-10 from CIFAR-100 by the file name (official "
                         "names: data_batch_N.bin, test_batch.bin / train.bin, test.bin); "
                         "give format: cifar10 or cifar100"));
    }
  }
  if (format_ == CifarFormat::kCifar10 && coarse_) {
    throw ConfigError(StrCat(pre, "label: coarse is CIFAR-100's; CIFAR-10 has one label"));
  }

  // Read every file, checking it is a whole number of records; keep HWC.
  const int64_t record = CifarRecordBytes(format_);
  const int64_t label_bytes = record - kPixels;
  const int64_t plane = kSide * kSide;
  std::vector<uint8_t> bytes;
  for (const std::string& file : files_) {
    const std::string error = ReadWholeFile(file, &bytes);
    if (!error.empty()) throw Error(StrCat("CIFAR: ", error));
    const int64_t n = static_cast<int64_t>(bytes.size());
    const char* layout = format_ == CifarFormat::kCifar10
                             ? "CIFAR-10: 1 label byte + 3072 pixel bytes"
                             : "CIFAR-100: 2 label bytes + 3072 pixel bytes";
    if (n == 0) throw Error(StrCat("CIFAR '", file, "': empty file"));
    if (n % record != 0) {
      throw Error(StrCat("CIFAR '", file, "': ", n, " bytes is not a whole number of ", record,
                         "-byte records (", layout, "): the record at offset ", n - n % record,
                         " has only ", n % record, " bytes"));
    }
    const int64_t records = n / record;
    file_start_.push_back(size());
    const size_t at = pixels_.size();
    pixels_.resize(at + static_cast<size_t>(records * kPixels));
    labels_.reserve(labels_.size() + static_cast<size_t>(records));
    for (int64_t r = 0; r < records; ++r) {
      const uint8_t* src = bytes.data() + r * record;
      labels_.push_back(src[coarse_ ? 0 : label_bytes - 1]);
      const uint8_t* chw = src + label_bytes;
      uint8_t* hwc = pixels_.data() + at + r * kPixels;
      for (int64_t p = 0; p < plane; ++p) {
        hwc[3 * p] = chw[p];
        hwc[3 * p + 1] = chw[plane + p];
        hwc[3 * p + 2] = chw[2 * plane + p];
      }
    }
  }
  const int64_t given = args.Int("num_classes");
  const int natural = format_ == CifarFormat::kCifar10 ? 10 : (coarse_ ? 20 : 100);
  num_classes_ = static_cast<int>(given > 0 ? given : natural);
  decoder_ = std::make_unique<ImageSampleDecoder>(sample_shape(), args);
}

ReadResult CifarDataset::Read(int64_t index, const ReadContext& ctx, float* dst) const {
  CNNFLOW_ENFORCE(index >= 0 && index < size(), "CIFAR '", path_, "': sample ", index,
                  " out of range [0, ", size(), ")");
  const int64_t label = labels_[static_cast<size_t>(index)];
  if (label >= num_classes_) {
    return {-1, StrCat(Key(index), ": label ", label, " out of range [0, ", num_classes_, ")")};
  }
  decoder_->AugmentPixels(hwc(index), kSide, kSide, ctx, index, dst);
  return {label, ""};
}

std::string CifarDataset::Key(int64_t index) const {
  const size_t f = static_cast<size_t>(
      std::upper_bound(file_start_.begin(), file_start_.end(), index) - file_start_.begin() - 1);
  const int64_t r = index - file_start_[f];
  return StrCat(files_[f], " record ", r, " (offset ", r * CifarRecordBytes(format_), ")");
}

std::string CifarDataset::description() const {
  return StrCat(format_ == CifarFormat::kCifar10 ? "CIFAR-10 " : "CIFAR-100 ", path_, " (", size(),
                " images in ", files_.size(), " file(s), samples of ", sample_shape(), ", ",
                num_classes_, " classes", coarse_ ? ", coarse labels" : "", ")");
}

CNNFLOW_REGISTER_SOURCE(
    cifar,
    AddImageAugmentParams(
        Schema("The official CIFAR-10 / CIFAR-100 binary batches (cifar-10-binary.tar.gz, "
               "cifar-100-binary.tar.gz): records of label byte(s) + 3072 bytes of 32x32 RGB "
               "planes -> samples [3, 32, 32] in [0, 1]; augmentation in training passes "
               "only, as the image sources do.")
            .Required("path", ParamType::kString,
                      "a batch file, or the folder holding them (cifar-10-batches-bin/, "
                      "cifar-100-binary/)")
            .Choice("split", {"train", "test"}, "train",
                    "with a folder: train (data_batch_1..5.bin / train.bin) or test "
                    "(test_batch.bin / test.bin)")
            .Choice("format", {"auto", "cifar10", "cifar100"}, "auto",
                    "auto: by the official file names")
            .Choice("label", {"fine", "coarse"}, "fine",
                    "CIFAR-100: the fine label (100 classes) or the coarse one (20)")
            .Optional("num_classes", ParamType::kInt, int64_t{0},
                      "0: 10, 100 (fine) or 20 (coarse)")),
    [](const Args& a) -> std::shared_ptr<Dataset> { return std::make_shared<CifarDataset>(a); });

}  // namespace cnnflow
