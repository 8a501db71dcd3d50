#include "loaders/lmdb_dataset.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "loaders/record.h"
#include "loaders/source_registry.h"

namespace cnnflow {

LmdbDataset::LmdbDataset(const Args& args) : reader_(args.String("path")) {
  CNNFLOW_ENFORCE(reader_.size() > 0, "LMDB '", reader_.path(), "' holds no records");
  // Labels (and, unless given, the sample shape) from the records' headers:
  // decoding a header reads no pixels.
  int64_t max_label = -1, max_series_length = 0;
  RecordView first;
  for (int64_t i = 0; i < reader_.size(); ++i) {
    RecordView r;
    if (!DecodeRecord(reader_.Get(i), &r).ok()) continue;  // reported when read
    if (max_label < 0) first = r;
    max_label = std::max(max_label, r.label);
    if (r.shape.size() == 2) max_series_length = std::max(max_series_length, r.shape[1]);
  }
  reader_.ReleaseThreadTransaction();
  if (max_label < 0) throw Error(StrCat("LMDB '", reader_.path(), "': no record could be decoded"));
  const int64_t given_classes = args.Int("num_classes");
  num_classes_ = static_cast<int>(given_classes > 0 ? given_classes : max_label + 1);
  std::vector<int64_t> shape = args.Ints("shape");
  if (shape.size() == 1 && shape[0] == 0) {
    shape = first.shape;
    if (shape.size() == 2) shape[1] = max_series_length;
  }
  if (shape.size() == 2) {
    if (shape[0] <= 0 || shape[1] <= 0) {
      throw ConfigError(StrCat("LMDB '", reader_.path(),
                               "': a series shape must be [C, L] with C, L > 0, got ",
                               Shape(shape)));
    }
    series_ = true;
    series_options_ = SeriesOptionsFromArgs(args);
    series_options_.length = shape[1];
    shape_ = Shape(shape);
    return;
  }
  if (shape.size() != 3 || shape[0] <= 0 || shape[1] <= 0 || shape[2] <= 0) {
    throw ConfigError(StrCat("LMDB '", reader_.path(),
                             "': give shape: [C, H, W] or [C, L] (the records ", "state ",
                             Shape(first.shape), ")"));
  }
  shape_ = Shape(shape);
  decoder_ = std::make_unique<ImageSampleDecoder>(shape_, args);
}

ReadResult LmdbDataset::Read(int64_t index, const ReadContext& ctx, float* dst) const {
  RecordView r;
  const RecordStatus status = DecodeRecord(reader_.Get(index), &r);
  if (!status.ok()) return {-1, status.message()};
  if (r.label < 0 || r.label >= num_classes_) {
    return {-1, StrCat("label ", r.label, " out of range [0, ", num_classes_, ")")};
  }
  if (series_) {
    if (r.encoding != RecordEncoding::kRaw || r.dtype != RecordDType::kF32 || r.shape.size() != 2 ||
        r.shape[0] != shape_[0]) {
      return {-1, StrCat("unsupported record: ", RecordEncodingName(r.encoding), " ",
                         RecordDTypeName(r.dtype), " ", Shape(r.shape), " for series samples of ",
                         shape_, " (raw f32 [C, L] expected)")};
    }
    // The payload may be unaligned (LMDB aligns values to 2 bytes).
    thread_local std::vector<float> values;
    values.resize(r.size / sizeof(float));
    if (r.size) std::memcpy(values.data(), r.data, r.size);
    FitSeries(values.data(), r.shape[0], r.shape[1], series_options_, ctx, index, dst);
    return {r.label, ""};
  }
  if (r.encoding == RecordEncoding::kJpeg || r.encoding == RecordEncoding::kPng) {
    const std::string error = decoder_->DecodeEncoded(r.data, r.size, ctx, index, dst);
    if (!error.empty()) return {-1, error};
    return {r.label, ""};
  }
  const int channels = decoder_->channels();
  if (r.shape.size() == 2) {
    return {-1,
            StrCat("record ", RecordDTypeName(r.dtype), " ", Shape(r.shape),
                   " is a series but the samples are images of ", shape_, " (give shape: [C, L])")};
  }
  const int64_t rc = r.shape.size() == 3 ? r.shape[0] : 0;
  if (r.encoding != RecordEncoding::kRaw || r.dtype != RecordDType::kU8 || (rc != 1 && rc != 3)) {
    return {-1, StrCat("unsupported record: ", RecordEncodingName(r.encoding), " ",
                       RecordDTypeName(r.dtype), " ", Shape(r.shape), " for samples of ", shape_)};
  }
  const int h = static_cast<int>(r.shape[1]);
  const int w = static_cast<int>(r.shape[2]);
  const size_t plane = static_cast<size_t>(h) * w;
  thread_local std::vector<uint8_t> hwc;
  hwc.resize(plane * std::max<int64_t>(rc, channels));
  for (int64_t c = 0; c < rc; ++c) {  // CHW -> HWC for the augmenter
    for (size_t p = 0; p < plane; ++p) hwc[p * rc + c] = r.data[c * plane + p];
  }
  // A gray record in a colour data set (or the reverse), as the decoder
  // would have given it from the image file.
  ConvertImageChannels(hwc.data(), plane, static_cast<int>(rc), channels);
  decoder_->AugmentPixels(hwc.data(), h, w, ctx, index, dst);
  return {r.label, ""};
}

std::string LmdbDataset::Key(int64_t index) const { return std::string(reader_.Key(index)); }

std::string LmdbDataset::description() const {
  return StrCat("LMDB ", reader_.path(), " (", size(), " records, samples of ", shape_, ", ",
                num_classes_, " classes)");
}

CNNFLOW_REGISTER_SOURCE(
    lmdb,
    AddSeriesFitParams(
        AddImageAugmentParams(
            Schema("An LMDB of records as `cnnflow convert` writes them (cnnflow layout or Caffe "
                   "Datum; raw uint8, JPEG or PNG images, decoded with TurboJPEG / libpng, "
                   "augmentation in training passes only; or raw f32 [C, L] series, fitted to "
                   "the sample length by fit / standardize as the ts and wav sources do).")
                .Required("path", ParamType::kString, "the LMDB folder (or data.mdb file)")
                .Optional("shape", ParamType::kIntList, std::vector<int64_t>{0},
                          "sample shape [C, H, W] or [C, L] (0: the first record's; for series "
                          "the longest record's length)")
                .Optional("num_classes", ParamType::kInt, int64_t{0}, "0: the largest label + 1")),
        "pad"),
    [](const Args& a) -> std::shared_ptr<Dataset> { return std::make_shared<LmdbDataset>(a); });

}  // namespace cnnflow
