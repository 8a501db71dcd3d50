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
#include "loaders/idx.h"
#include "loaders/image_decoder.h"
#include "loaders/image_folder.h"
#include "loaders/jpeg_decoder.h"
#include "loaders/lmdb_store.h"
#include "loaders/record.h"
#include "loaders/series_dataset.h"
#include "loaders/ts_format.h"
#include "loaders/wav.h"
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
int64_t Skipped(const ConvertSummary& s) { return static_cast<int64_t>(s.skipped.size()); }
}  // namespace

ConvertSummary ConvertToLmdb(const ConvertOptions& options, const ConvertProgressFn& progress) {
  const auto start = std::chrono::steady_clock::now();
  ConvertOptions o = options;
  ValidateConvertOptions(&o);
  const bool caffe = o.format == "caffe";
  const bool resize = o.resize_h > 0;
  // Checked before the (possibly long) scan, so the mistake costs nothing.
  std::error_code exists_ec;
  if (!o.overwrite && fs::exists(o.to, exists_ec)) {
    throw Error(StrCat("output '", o.to, "' already exists (--overwrite replaces it)"));
  }

  ImageFolder folder;
  std::unique_ptr<IdxDataset> idx;
  TsFile ts;
  WavFolder wav;
  ConvertSummary summary;
  int64_t count = 0;
  if (o.from == "ts") {
    ts = ReadTsFile(o.src);
    count = ts.size();
    summary.classes = static_cast<int64_t>(ts.class_labels.size());
  } else if (o.from == "wav") {
    wav = ScanWavFolder(o.src, o.label_regex, o.select);
    count = static_cast<int64_t>(wav.paths.size());
    summary.classes = static_cast<int64_t>(wav.classes.size());
  } else if (o.from == "folder") {
    folder = ScanImageFolder(o.src);
    count = static_cast<int64_t>(folder.entries.size());
    summary.classes = static_cast<int64_t>(folder.classes.size());
  } else {
    idx = IdxDataset::Open(o.src, o.labels);
    count = idx->size();
    summary.classes = idx->num_classes();
  }
  const std::vector<int64_t> order = ConvertWriteOrder(count, o.shuffle, o.seed, o.limit);
  const auto total = static_cast<int64_t>(order.size());

  LmdbWriter::Options wopts;
  wopts.overwrite = o.overwrite;
  LmdbWriter writer(o.to, wopts);

  std::vector<uint8_t> file, hwc, resized;
  std::vector<float> audio;
  std::string payload;
  RecordView rec;
  for (const int64_t src_index : order) {
    if (!ts.cases.empty() || !wav.paths.empty()) {  // a series: raw f32 [C, L]
      rec.encoding = RecordEncoding::kRaw;
      rec.dtype = RecordDType::kF32;
      const float* values = nullptr;
      if (!ts.cases.empty()) {
        rec.label = ts.labels[src_index];
        rec.shape = {ts.channels, ts.lengths[src_index]};
        values = ts.cases[src_index].data();
      } else {
        const std::string& path = wav.paths[src_index];
        try {
          audio = ReadWav(path);  // Error naming the file
        } catch (const Error& e) {
          if (!o.skip_bad) throw;
          summary.skipped.push_back(e.what());
          if (progress) progress(summary.records + Skipped(summary), total);
          continue;
        }
        rec.label = wav.labels[src_index];
        rec.shape = {1, static_cast<int64_t>(audio.size())};
        values = audio.data();
      }
      rec.data = reinterpret_cast<const uint8_t*>(values);
      rec.size = static_cast<size_t>(rec.shape[0] * rec.shape[1]) * sizeof(float);
      const std::string value = EncodeCnnflowRecord(rec);
      writer.Put(LmdbWriter::IndexKey(summary.records), value);
      summary.value_bytes += value.size();
      ++summary.records;
      if (progress) progress(summary.records + Skipped(summary), total);
      continue;
    }
    rec.dtype = RecordDType::kU8;
    // The pixels to store raw or re-encode: HWC [h, w, c]. Left null when
    // the record keeps the file's bytes.
    const uint8_t* pixels = nullptr;
    int h = 0, w = 0, c = 0;
    if (idx) {
      rec.label = idx->label(src_index);
      pixels = idx->pixels(src_index);
      h = static_cast<int>(idx->rows());
      w = static_cast<int>(idx->cols());
      c = 1;
    } else {
      const ImageFolderEntry& e = folder.entries[static_cast<size_t>(src_index)];
      const std::string where = StrCat("'", e.path, "'");
      // A bad file: fails the conversion, or (skip_bad) is listed and left out.
      auto bad = [&](const std::string& error) {
        if (!o.skip_bad) throw Error(error);
        summary.skipped.push_back(error);
        if (progress) progress(summary.records + Skipped(summary), total);
      };
      const std::string read_error = ReadWholeFile(e.path, &file);
      if (!read_error.empty()) {
        bad(read_error);
        continue;
      }
      rec.label = e.label;
      const ImageResult header = ReadImageHeader(file.data(), file.size());
      if (!header.ok()) {
        bad(StrCat(where, ": ", header.error));
        continue;
      }
      c = DefaultImageChannels(header.channels);  // CMYK and alpha are not kept
      h = header.height;
      w = header.width;
      if (o.encoded && !resize) {
        rec.encoding =
            header.format == ImageFormat::kPng ? RecordEncoding::kPng : RecordEncoding::kJpeg;
        rec.shape = {c, h, w};
        rec.data = file.data();
        rec.size = file.size();
      } else {
        const ImageResult d = DecodeImage(file.data(), file.size(), c, &hwc);
        if (!d.ok()) {
          bad(StrCat(where, ": ", d.error));
          continue;
        }
        pixels = hwc.data();
      }
    }
    if (pixels != nullptr) {
      if (resize) {
        ResizeHwc(pixels, h, w, c, o.resize_h, o.resize_w, &resized);
        pixels = resized.data();
        h = o.resize_h;
        w = o.resize_w;
      }
      rec.shape = {c, h, w};
      if (o.encoded) {  // only reached with a resize: the new pixels need new bytes
        payload = EncodeJpeg(pixels, w, h, c, o.jpeg_quality);
        rec.encoding = RecordEncoding::kJpeg;
        summary.reencoded = true;
      } else {
        HwcToChw(pixels, static_cast<size_t>(h) * w, c, &payload);
        rec.encoding = RecordEncoding::kRaw;
      }
      rec.data = reinterpret_cast<const uint8_t*>(payload.data());
      rec.size = payload.size();
    }
    const std::string value = caffe ? EncodeCaffeDatum(rec) : EncodeCnnflowRecord(rec);
    writer.Put(LmdbWriter::IndexKey(summary.records), value);
    summary.value_bytes += value.size();
    ++summary.records;
    if (progress) progress(summary.records + Skipped(summary), total);
  }
  writer.Finish();
  summary.encoded = o.encoded == 1;
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::error_code ec;
  const auto n = fs::file_size(fs::path(o.to) / "data.mdb", ec);
  if (!ec) summary.disk_bytes = n;
  return summary;
}

}  // namespace cnnflow
