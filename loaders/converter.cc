#include "loaders/converter.h"

#include <chrono>
#include <filesystem>
#include <memory>
#include <numeric>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <utility>

#include "loaders/augment.h"
#include "loaders/folder_dataset.h"
#include "loaders/idx_dataset.h"
#include "loaders/image_decoder.h"
#include "loaders/image_folder.h"
#include "loaders/jpeg_decoder.h"
#include "loaders/lmdb_store.h"
#include "loaders/record.h"
#include "loaders/ts_dataset.h"
#include "loaders/ts_format.h"
#include "loaders/wav.h"
#include "loaders/wav_dataset.h"
#include "ops/error.h"
#include "ops/random.h"

namespace cnnflow {
namespace {
namespace fs = std::filesystem;

// HWC uint8 [h, w, c] -> [out_h, out_w, c] in *dst.
void ResizeHwc(const uint8_t* src, int h, int w, int c, int out_h, int out_w,
               std::vector<uint8_t>* dst) {
  UseSerialOpenCv();
  dst->resize(static_cast<size_t>(out_h) * out_w * c);
  const cv::Mat in(h, w, CV_8UC(c), const_cast<uint8_t*>(src));
  cv::Mat out(out_h, out_w, CV_8UC(c), dst->data());
  // Area averaging when shrinking (no aliasing), bilinear when growing (what
  // INTER_AREA falls back to anyway, but stated).
  const int interpolation = out_h <= h && out_w <= w ? cv::INTER_AREA : cv::INTER_LINEAR;
  cv::resize(in, out, cv::Size(out_w, out_h), 0, 0, interpolation);
  CNNFLOW_ENFORCE(out.data == dst->data(), "cv::resize reallocated its output");
}

void HwcToChw(const uint8_t* hwc, size_t plane, int c, std::string* chw) {
  chw->resize(plane * c);
  for (size_t p = 0; p < plane; ++p) {
    for (int ch = 0; ch < c; ++ch) (*chw)[ch * plane + p] = static_cast<char>(hwc[p * c + ch]);
  }
}

}  // namespace

void ValidateConvertOptions(ConvertOptions* o) {
  if (o->from != "folder" && o->from != "idx" && o->from != "ts" && o->from != "wav") {
    throw ConfigError(o->from.empty()
                          ? "--from folder|idx|ts|wav is required"
                          : StrCat("--from must be folder, idx, ts or wav, got '", o->from, "'"));
  }
  if (o->src.empty()) throw ConfigError(StrCat("SRC is required (--from ", o->from, " SRC)"));
  if (o->to.empty()) throw ConfigError("--to LMDB_DIR is required");
  if (o->format != "cnnflow" && o->format != "caffe") {
    throw ConfigError(StrCat("--format must be cnnflow or caffe, got '", o->format, "'"));
  }
  const bool series = o->from == "ts" || o->from == "wav";
  if (o->from != "wav" && (!o->select.empty() || o->label_regex != ConvertOptions().label_regex)) {
    throw ConfigError("--label-regex and --select apply to --from wav only");
  }
  if (series) {
    if (o->format != "cnnflow") {
      throw ConfigError(StrCat("--format ", o->format, ": a Caffe Datum holds images; --from ",
                               o->from, " writes f32 [C, L] series in the cnnflow layout only"));
    }
    if (!o->labels.empty()) throw ConfigError("--labels applies to --from idx only");
    if (o->encoded == 1) throw ConfigError("--encoded applies to image folders only");
    if (o->resize_h > 0 || o->resize_w > 0) throw ConfigError("--resize applies to images only");
    if (o->from == "wav" && o->label_regex.empty())
      throw ConfigError("--label-regex must not be empty");
    o->encoded = 0;
  } else if (o->from == "idx") {
    if (o->labels.empty()) throw ConfigError("--from idx needs --labels IDX_LABELS");
    if (o->encoded == 1) throw ConfigError("--encoded applies to image folders only");
    o->encoded = 0;
  } else {
    if (!o->labels.empty()) throw ConfigError("--labels applies to --from idx only");
    if (o->encoded < 0) o->encoded = 1;
  }
  if (o->resize_h < 0 || o->resize_w < 0 || (o->resize_h > 0) != (o->resize_w > 0) ||
      o->resize_h > kMaxImageSide || o->resize_w > kMaxImageSide) {
    throw ConfigError(StrCat("--resize needs H,W both in 1..", kMaxImageSide, ", got ", o->resize_h,
                             ",", o->resize_w));
  }
  if (o->jpeg_quality < 1 || o->jpeg_quality > 100) {
    throw ConfigError(StrCat("JPEG quality must be 1..100, got ", o->jpeg_quality));
  }
}

std::vector<int64_t> ConvertWriteOrder(int64_t n, bool shuffle, uint64_t seed, int64_t limit) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (shuffle) {
    Rng rng(seed);
    for (int64_t i = n - 1; i > 0; --i) {
      std::swap(order[i], order[rng.Below(static_cast<uint64_t>(i) + 1)]);
    }
  }
  if (limit >= 0 && limit < n) order.resize(static_cast<size_t>(limit));
  return order;
}

namespace {

// One conversion: the source opened, then each record read, converted and
// written, in the write order.
class Conversion {
 public:
  Conversion(const ConvertOptions& o, const ConvertProgressFn& progress)
      : o_(o), progress_(progress) {}

  ConvertSummary Run() {
    const std::vector<int64_t> order =
        ConvertWriteOrder(OpenSource(), o_.shuffle, o_.seed, o_.limit);
    total_ = static_cast<int64_t>(order.size());
    LmdbWriter::Options wopts;
    wopts.overwrite = o_.overwrite;
    LmdbWriter writer(o_.to, wopts);
    const bool series = !ts_.cases.empty() || !wav_.paths.empty();
    for (const int64_t i : order) {
      if (series ? SeriesRecord(i) : ImageRecord(i)) Put(writer);
    }
    writer.Finish();
    summary_.encoded = o_.encoded == 1;
    return summary_;
  }

 private:
  // Opens or scans the source; returns its number of records.
  int64_t OpenSource() {
    if (o_.from == "ts") {
      ts_ = ReadTsFile(o_.src);
      summary_.classes = static_cast<int64_t>(ts_.class_labels.size());
      return ts_.size();
    }
    if (o_.from == "wav") {
      wav_ = ScanWavFolder(o_.src, o_.label_regex, o_.select);
      summary_.classes = static_cast<int64_t>(wav_.classes.size());
      return static_cast<int64_t>(wav_.paths.size());
    }
    if (o_.from == "folder") {
      folder_ = ScanImageFolder(o_.src);
      summary_.classes = static_cast<int64_t>(folder_.classes.size());
      return static_cast<int64_t>(folder_.entries.size());
    }
    idx_ = IdxDataset::Open(o_.src, o_.labels);
    summary_.classes = idx_->num_classes();
    return idx_->size();
  }

  // Record `i` of a series source as raw f32 [C, L]. False: a bad file, skipped.
  bool SeriesRecord(int64_t i) {
    rec_.encoding = RecordEncoding::kRaw;
    rec_.dtype = RecordDType::kF32;
    const float* values = nullptr;
    if (!ts_.cases.empty()) {
      rec_.label = ts_.labels[i];
      rec_.shape = {ts_.channels, ts_.lengths[i]};
      values = ts_.cases[i].data();
    } else {
      try {
        audio_ = ReadWav(wav_.paths[i]);  // Error naming the file
      } catch (const Error& e) {
        if (!o_.skip_bad) throw;
        Skip(e.what());
        return false;
      }
      rec_.label = wav_.labels[i];
      rec_.shape = {1, static_cast<int64_t>(audio_.size())};
      values = audio_.data();
    }
    rec_.data = reinterpret_cast<const uint8_t*>(values);
    rec_.size = static_cast<size_t>(rec_.shape[0] * rec_.shape[1]) * sizeof(float);
    return true;
  }

  // Record `i` of an image source: the file's bytes kept (encoded, no
  // resize), or its pixels stored raw or re-encoded. False: a bad file, skipped.
  bool ImageRecord(int64_t i) {
    rec_.dtype = RecordDType::kU8;
    const uint8_t* pixels = nullptr;  // HWC [h, w, c]; null: the file's bytes are kept
    int h = 0, w = 0, c = 0;
    if (idx_) {
      rec_.label = idx_->label(i);
      pixels = idx_->pixels(i);
      h = static_cast<int>(idx_->rows());
      w = static_cast<int>(idx_->cols());
      c = 1;
    } else if (!FolderImage(folder_.entries[static_cast<size_t>(i)], &pixels, &h, &w, &c)) {
      return false;
    }
    if (pixels != nullptr) StorePixels(pixels, h, w, c);
    return true;
  }

  // Reads an image file: into rec_ as it is (encoded, no resize), else
  // decoded into *pixels. False: a bad file, skipped.
  bool FolderImage(const ImageFolderEntry& e, const uint8_t** pixels, int* h, int* w, int* c) {
    const std::string where = StrCat("'", e.path, "'");
    const std::string read_error = ReadWholeFile(e.path, &file_);
    if (!read_error.empty()) return Bad(read_error);
    rec_.label = e.label;
    const ImageResult header = ReadImageHeader(file_.data(), file_.size());
    if (!header.ok()) return Bad(StrCat(where, ": ", header.error));
    *c = DefaultImageChannels(header.channels);  // CMYK and alpha are not kept
    *h = header.height;
    *w = header.width;
    if (o_.encoded && o_.resize_h == 0) {
      rec_.encoding =
          header.format == ImageFormat::kPng ? RecordEncoding::kPng : RecordEncoding::kJpeg;
      rec_.shape = {*c, *h, *w};
      rec_.data = file_.data();
      rec_.size = file_.size();
      return true;
    }
    const ImageResult d = DecodeImage(file_.data(), file_.size(), *c, &hwc_);
    if (!d.ok()) return Bad(StrCat(where, ": ", d.error));
    *pixels = hwc_.data();
    return true;
  }

  // HWC pixels into rec_: resized if asked, then raw CHW or a new JPEG.
  void StorePixels(const uint8_t* pixels, int h, int w, int c) {
    if (o_.resize_h > 0) {
      ResizeHwc(pixels, h, w, c, o_.resize_h, o_.resize_w, &resized_);
      pixels = resized_.data();
      h = o_.resize_h;
      w = o_.resize_w;
    }
    rec_.shape = {c, h, w};
    if (o_.encoded) {  // only reached with a resize: the new pixels need new bytes
      payload_ = EncodeJpeg(pixels, w, h, c, o_.jpeg_quality);
      rec_.encoding = RecordEncoding::kJpeg;
      summary_.reencoded = true;
    } else {
      HwcToChw(pixels, static_cast<size_t>(h) * w, c, &payload_);
      rec_.encoding = RecordEncoding::kRaw;
    }
    rec_.data = reinterpret_cast<const uint8_t*>(payload_.data());
    rec_.size = payload_.size();
  }

  void Put(LmdbWriter& writer) {
    const std::string value =
        o_.format == "caffe" ? EncodeCaffeDatum(rec_) : EncodeCnnflowRecord(rec_);
    writer.Put(LmdbWriter::IndexKey(summary_.records), value);
    summary_.value_bytes += value.size();
    ++summary_.records;
    Progress();
  }

  // A bad file fails the conversion, or (skip_bad) is listed and left out.
  bool Bad(const std::string& error) {
    if (!o_.skip_bad) throw Error(error);
    Skip(error);
    return false;
  }
  void Skip(const std::string& error) {
    summary_.skipped.push_back(error);
    Progress();
  }
  void Progress() {
    if (progress_)
      progress_(summary_.records + static_cast<int64_t>(summary_.skipped.size()), total_);
  }

  const ConvertOptions& o_;
  const ConvertProgressFn& progress_;
  ConvertSummary summary_;
  int64_t total_ = 0;
  // The source: one of these.
  ImageFolder folder_;
  std::unique_ptr<IdxDataset> idx_;
  TsFile ts_;
  WavFolder wav_;
  // Buffers reused from record to record.
  std::vector<uint8_t> file_, hwc_, resized_;
  std::vector<float> audio_;
  std::string payload_;
  RecordView rec_;
};

}  // namespace

ConvertSummary ConvertToLmdb(const ConvertOptions& options, const ConvertProgressFn& progress) {
  const auto start = std::chrono::steady_clock::now();
  ConvertOptions o = options;
  ValidateConvertOptions(&o);
  // Checked before the (possibly long) scan, so the mistake costs nothing.
  std::error_code exists_ec;
  if (!o.overwrite && fs::exists(o.to, exists_ec)) {
    throw Error(StrCat("output '", o.to, "' already exists (--overwrite replaces it)"));
  }
  ConvertSummary summary = Conversion(o, progress).Run();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::error_code ec;
  const auto n = fs::file_size(fs::path(o.to) / "data.mdb", ec);
  if (!ec) summary.disk_bytes = n;
  return summary;
}

}  // namespace cnnflow
