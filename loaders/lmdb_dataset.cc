#include "loaders/lmdb_dataset.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "loaders/jpeg_decoder.h"
#include "loaders/record.h"
#include "loaders/source_registry.h"

namespace cnnflow {

LmdbDataset::LmdbDataset(const Args& args) : reader_(args.String("path")) {
  CNNFLOW_ENFORCE(reader_.size() > 0, "LMDB '", reader_.path(), "' holds no records");
  // Labels (and, unless given, the sample shape) from the records' headers:
  // decoding a header reads no pixels.
  int64_t max_label = -1;
  RecordView first;
  for (int64_t i = 0; i < reader_.size(); ++i) {
    RecordView r;
    if (!DecodeRecord(reader_.Get(i), &r).ok()) continue;  // reported when read
    if (max_label < 0) first = r;
    max_label = std::max(max_label, r.label);
  }
  reader_.ReleaseThreadTransaction();
  if (max_label < 0) throw Error(StrCat("LMDB '", reader_.path(), "': no record could be decoded"));
  const int64_t given_classes = args.Int("num_classes");
  num_classes_ = static_cast<int>(given_classes > 0 ? given_classes : max_label + 1);
  std::vector<int64_t> shape = args.Ints("shape");
  if (shape.size() == 1 && shape[0] == 0) shape = first.shape;
  if (shape.size() != 3 || shape[0] <= 0 || shape[1] <= 0 || shape[2] <= 0) {
    throw ConfigError(StrCat("LMDB '", reader_.path(), "': give shape: [C, H, W] (the records ",
                             "state ", Shape(first.shape), ")"));
  }
  shape_ = Shape(shape);
  resize_min_side_ = static_cast<int>(args.Int("resize_min_side"));
  AugmentOptions o;
  o.out_h = static_cast<int>(shape[1]);
  o.out_w = static_cast<int>(shape[2]);
  o.resize_min_side = resize_min_side_;
  eval_augment_ = std::make_unique<Augmenter>(o);  // centre crop, no flip, no padding
  o.pad = static_cast<int>(args.Int("pad"));
  o.random_crop = args.Bool("random_crop");
  o.hflip = args.Bool("hflip");
  train_augment_ = std::make_unique<Augmenter>(o);
}

ReadResult LmdbDataset::Read(int64_t index, const ReadContext& ctx, float* dst) const {
  RecordView r;
  const RecordStatus status = DecodeRecord(reader_.Get(index), &r);
  if (!status.ok()) return {-1, status.message()};
  if (r.label < 0 || r.label >= num_classes_) {
    return {-1, StrCat("label ", r.label, " out of range [0, ", num_classes_, ")")};
  }
  const int channels = static_cast<int>(shape_[0]);
  thread_local std::vector<uint8_t> hwc;
  int h = 0, w = 0;
  if (r.encoding == RecordEncoding::kJpeg) {
    JpegDecoder& decoder = ThreadLocalJpegDecoder();
    const JpegResult header = decoder.ReadHeader(r.data, r.size);
    if (!header.ok()) return {-1, header.error};
    hwc.resize(static_cast<size_t>(header.width) * header.height * channels);
    const JpegResult jr =
        decoder.Decode(r.data, r.size, channels, hwc.data(), hwc.size(), resize_min_side_);
    if (!jr.ok()) return {-1, jr.error};
    h = jr.height;
    w = jr.width;
  } else if (r.encoding == RecordEncoding::kRaw && r.dtype == RecordDType::kU8 &&
             r.shape.size() == 3 && r.shape[0] == channels) {
    h = static_cast<int>(r.shape[1]);
    w = static_cast<int>(r.shape[2]);
    hwc.resize(static_cast<size_t>(h) * w * channels);
    for (int c = 0; c < channels; ++c)  // CHW -> HWC for the augmenter
      for (int64_t p = 0; p < static_cast<int64_t>(h) * w; ++p) hwc[p * channels + c] = r.data[c * h * w + p];
  } else {
    return {-1, StrCat("unsupported record: ", RecordEncodingName(r.encoding), " ",
                       RecordDTypeName(r.dtype), " ", Shape(r.shape), " for samples of ", shape_,
                       r.encoding == RecordEncoding::kPng ? " (PNG decoding is not built in yet)" : "")};
  }
  (ctx.train ? *train_augment_ : *eval_augment_).Run(hwc.data(), h, w, channels, ctx.seed, ctx.epoch, index, dst);
  return {r.label, ""};
}

std::string LmdbDataset::Key(int64_t index) const { return std::string(reader_.Key(index)); }

std::string LmdbDataset::description() const {
  return StrCat("LMDB ", reader_.path(), " (", size(), " records, samples of ", shape_, ", ",
                num_classes_, " classes)");
}

CNNFLOW_REGISTER_SOURCE(
    lmdb,
    Schema("An LMDB of records as `cnnflow convert` writes them (cnnflow layout or Caffe Datum; "
           "raw uint8 or JPEG), decoded with TurboJPEG; augmentation in training passes only.")
        .Required("path", ParamType::kString, "the LMDB folder (or data.mdb file)")
        .Optional("shape", ParamType::kIntList, std::vector<int64_t>{0},
                  "sample shape [C, H, W] (0: the first record's)")
        .Optional("num_classes", ParamType::kInt, int64_t{0}, "0: the largest label + 1")
        .Optional("pad", ParamType::kInt, int64_t{0}, "zero padding before a random crop")
        .Optional("random_crop", ParamType::kBool, false, "random crop (else centre crop)")
        .Optional("hflip", ParamType::kBool, false, "random horizontal flip")
        .Optional("resize_min_side", ParamType::kInt, int64_t{0},
                  "resize so the shorter side is this before cropping (0: no resize)"),
    [](const Args& a) -> std::shared_ptr<Dataset> { return std::make_shared<LmdbDataset>(a); });

}  // namespace cnnflow
