#include "tools/convert.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "loaders/idx.h"
#include "loaders/image_folder.h"
#include "loaders/jpeg_decoder.h"
#include "loaders/lmdb_store.h"
#include "loaders/record.h"
#include "ops/error.h"
#include "ops/random.h"
#include "pipeline/progress.h"

namespace cnnflow {
namespace {
namespace fs = std::filesystem;

constexpr const char* kConvertUsage = R"(usage: cnnflow convert --from folder|idx SRC --to LMDB_DIR [options]

  --from folder SRC   SRC/<class>/<image>: .jpg/.jpeg/.png, classes sorted by name
  --from idx SRC      SRC = IDX images file (gzip or plain); needs --labels
  --to LMDB_DIR       the new LMDB (written as LMDB_DIR.tmp, renamed when done)
  --labels FILE       IDX labels file (idx only)
  --format F          record layout: cnnflow (default) or caffe (Datum protobuf)
  --encoded           keep the image file's bytes (JPEG/PNG) as they are
                      (the default for folders)
  --raw               decode to raw uint8 CHW pixels (JPEG only; default for idx)
  --shuffle           write the records in a random order (Fisher-Yates)
  --seed N            seed of --shuffle (default 0)
  --limit N           write only the first N records (after shuffling)
  --overwrite         replace LMDB_DIR if it exists
)";

// A usage mistake: exit code 2 with the usage text.
struct UsageError : Error {
  using Error::Error;
};

struct ConvertOptions {
  std::string from, src, to, labels, format = "cnnflow";
  int encoded = -1;  // -1: the source's default
  bool shuffle = false, overwrite = false;
  uint64_t seed = 0;
  int64_t limit = -1;
};

int64_t ParseInt(const std::string& flag, const std::string& s) {
  size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos != s.size() || s.empty() || v < 0) {
    throw UsageError(StrCat(flag, " expects a non-negative integer, got '", s, "'"));
  }
  return v;
}

ConvertOptions ParseArgs(const std::vector<std::string>& args) {
  ConvertOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], inline_value;
    bool has_inline = false;
    if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) {
      inline_value = a.substr(a.find('=') + 1);
      a = a.substr(0, a.find('='));
      has_inline = true;
    }
    auto value = [&]() -> std::string {
      if (has_inline) return inline_value;
      if (i + 1 >= args.size()) throw UsageError(StrCat(a, " needs a value"));
      return args[++i];
    };
    if (a == "--from") {
      o.from = value();
    } else if (a == "--to") {
      o.to = value();
    } else if (a == "--labels") {
      o.labels = value();
    } else if (a == "--format") {
      o.format = value();
    } else if (a == "--seed") {
      o.seed = static_cast<uint64_t>(ParseInt(a, value()));
    } else if (a == "--limit") {
      o.limit = ParseInt(a, value());
    } else if (a == "--encoded" && !has_inline) {
      o.encoded = 1;
    } else if (a == "--raw" && !has_inline) {
      o.encoded = 0;
    } else if (a == "--shuffle" && !has_inline) {
      o.shuffle = true;
    } else if (a == "--overwrite" && !has_inline) {
      o.overwrite = true;
    } else if (a == "-h" || a == "--help") {
      throw UsageError("");  // RunConvert prints the usage and returns 0
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError(StrCat("unknown option '", args[i], "'"));
    } else if (o.src.empty()) {
      o.src = a;
    } else {
      throw UsageError(StrCat("unexpected argument '", a, "'"));
    }
  }
  if (o.from != "folder" && o.from != "idx") {
    throw UsageError(o.from.empty() ? "--from folder|idx is required"
                                    : StrCat("--from must be folder or idx, got '", o.from, "'"));
  }
  if (o.src.empty()) throw UsageError("SRC is required (--from " + o.from + " SRC)");
  if (o.to.empty()) throw UsageError("--to LMDB_DIR is required");
  if (o.format != "cnnflow" && o.format != "caffe") {
    throw UsageError(StrCat("--format must be cnnflow or caffe, got '", o.format, "'"));
  }
  if (o.from == "idx") {
    if (o.labels.empty()) throw UsageError("--from idx needs --labels IDX_LABELS");
    if (o.encoded == 1) throw UsageError("--encoded applies to image folders only");
    o.encoded = 0;
  } else {
    if (!o.labels.empty()) throw UsageError("--labels applies to --from idx only");
    if (o.encoded < 0) o.encoded = 1;
  }
  return o;
}

std::string ReadFileBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw Error(StrCat("cannot open '", path, "': ", std::strerror(errno)));
  const std::streamsize n = f.tellg();
  std::string bytes(static_cast<size_t>(n), '\0');
  f.seekg(0);
  if (!f.read(bytes.data(), n)) throw Error(StrCat("cannot read '", path, "'"));
  return bytes;
}

bool IsPng(const std::string& b) {
  return b.size() >= 8 && std::memcmp(b.data(), "\x89PNG\r\n\x1a\n", 8) == 0;
}

// [C, H, W] from a PNG's IHDR chunk (C from the colour type; palette -> 3).
std::vector<int64_t> PngShape(const std::string& b, const std::string& path) {
  if (b.size() < 26 || std::memcmp(b.data() + 12, "IHDR", 4) != 0) {
    throw Error(StrCat("corrupt PNG header in '", path, "'"));
  }
  auto be32 = [&](size_t off) {
    const auto* p = reinterpret_cast<const uint8_t*>(b.data()) + off;
    return int64_t{p[0]} << 24 | int64_t{p[1]} << 16 | int64_t{p[2]} << 8 | int64_t{p[3]};
  };
  static constexpr int kChannels[7] = {1, 0, 3, 3, 2, 0, 4};
  const int type = static_cast<uint8_t>(b[25]);
  if (type > 6 || kChannels[type] == 0) {
    throw Error(StrCat("corrupt PNG header in '", path, "': colour type ", type));
  }
  return {kChannels[type], be32(20), be32(16)};
}

// Progress: a redrawn line on a terminal, else a line per ~10%.
class ConvertProgress {
 public:
  explicit ConvertProgress(int64_t total) : total_(total), tty_(isatty(fileno(stderr)) != 0) {}
  void Update(int64_t done, double elapsed_s) {
    const int64_t decile = total_ > 0 ? done * 10 / total_ : 10;
    if (tty_ ? (done % 256 != 0 && done != total_) : (decile == last_decile_ && done != total_)) {
      return;
    }
    if (!tty_ && decile == last_decile_) return;
    last_decile_ = decile;
    const double rate = elapsed_s > 0 ? done / elapsed_s : 0;
    const double eta = rate > 0 ? (total_ - done) / rate : 0;
    std::fprintf(stderr, "%s%lld/%lld records (%3.0f%%)  %.0f records/s  ETA %s%s",
                 tty_ ? "\r\033[K" : "", static_cast<long long>(done),
                 static_cast<long long>(total_), total_ > 0 ? 100.0 * done / total_ : 100.0, rate,
                 FormatDuration(eta).c_str(), tty_ ? "" : "\n");
    std::fflush(stderr);
  }
  void End() {
    if (tty_) std::fprintf(stderr, "\n");
  }

 private:
  int64_t total_;
  bool tty_;
  int64_t last_decile_ = 0;  // the first line comes at 10%
};

// The order of source indices to write: identity, shuffled with Rng(seed)
// (Fisher-Yates), then cut to `limit`.
std::vector<int64_t> WriteOrder(int64_t n, const ConvertOptions& o) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (o.shuffle) {
    Rng rng(o.seed);
    for (int64_t i = n - 1; i > 0; --i) {
      std::swap(order[i], order[rng.Below(static_cast<uint64_t>(i) + 1)]);
    }
  }
  if (o.limit >= 0 && o.limit < n) order.resize(static_cast<size_t>(o.limit));
  return order;
}

int Convert(const ConvertOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const bool caffe = o.format == "caffe";
  // Checked before the (possibly long) scan, so the mistake costs nothing.
  std::error_code exists_ec;
  if (!o.overwrite && fs::exists(o.to, exists_ec)) {
    throw Error(StrCat("output '", o.to, "' already exists (--overwrite replaces it)"));
  }

  // The source: a count and a function that fills record i's fields
  // (record.data points into `payload` or the source's memory).
  ImageFolder folder;
  std::unique_ptr<IdxDataset> idx;
  int64_t count = 0, classes = 0;
  if (o.from == "folder") {
    folder = ScanImageFolder(o.src);
    count = static_cast<int64_t>(folder.entries.size());
    classes = static_cast<int64_t>(folder.classes.size());
  } else {
    idx = IdxDataset::Open(o.src, o.labels);
    count = idx->size();
    classes = idx->num_classes();
  }
  const std::vector<int64_t> order = WriteOrder(count, o);

  LmdbWriter::Options wopts;
  wopts.overwrite = o.overwrite;
  LmdbWriter writer(o.to, wopts);

  JpegDecoder decoder;
  std::string file, payload;
  std::vector<uint8_t> hwc;
  RecordView rec;
  ConvertProgress progress(static_cast<int64_t>(order.size()));
  uint64_t value_bytes = 0;
  int64_t written = 0;
  for (const int64_t src_index : order) {
    rec.shape.clear();
    rec.dtype = RecordDType::kU8;
    if (idx) {
      rec.label = idx->label(src_index);
      rec.shape = {1, idx->rows(), idx->cols()};
      rec.encoding = RecordEncoding::kRaw;
      rec.data = idx->pixels(src_index);
      rec.size = static_cast<size_t>(idx->rows() * idx->cols());
    } else {
      const ImageFolderEntry& e = folder.entries[static_cast<size_t>(src_index)];
      file = ReadFileBytes(e.path);
      rec.label = e.label;
      const auto* bytes = reinterpret_cast<const uint8_t*>(file.data());
      if (IsPng(file)) {
        if (!o.encoded) {
          throw Error(StrCat("'", e.path,
                             "' is a PNG: decoding PNG to raw pixels is not supported yet; "
                             "use --encoded"));
        }
        rec.shape = PngShape(file, e.path);
        rec.encoding = RecordEncoding::kPng;
        rec.data = bytes;
        rec.size = file.size();
      } else {
        const JpegResult h = decoder.ReadHeader(bytes, file.size());
        if (!h.ok()) throw Error(StrCat("'", e.path, "': ", h.error));
        const int channels = h.channels == 1 ? 1 : 3;  // CMYK is decoded to RGB
        rec.shape = {channels, h.height, h.width};
        if (o.encoded) {
          rec.encoding = RecordEncoding::kJpeg;
          rec.data = bytes;
          rec.size = file.size();
        } else {
          const size_t plane = static_cast<size_t>(h.width) * h.height;
          hwc.resize(plane * channels);
          const JpegResult d =
              decoder.Decode(bytes, file.size(), channels, hwc.data(), hwc.size());
          if (!d.ok()) throw Error(StrCat("'", e.path, "': ", d.error));
          payload.resize(hwc.size());
          for (size_t p = 0; p < plane; ++p) {  // HWC -> CHW
            for (int c = 0; c < channels; ++c) {
              payload[c * plane + p] = static_cast<char>(hwc[p * channels + c]);
            }
          }
          rec.encoding = RecordEncoding::kRaw;
          rec.data = reinterpret_cast<const uint8_t*>(payload.data());
          rec.size = payload.size();
        }
      }
    }
    const std::string value = caffe ? EncodeCaffeDatum(rec) : EncodeCnnflowRecord(rec);
    writer.Put(LmdbWriter::IndexKey(written), value);
    value_bytes += value.size();
    ++written;
    progress.Update(written, elapsed());
  }
  writer.Finish();
  progress.End();
  const double seconds = elapsed();

  std::error_code ec;
  uint64_t disk_bytes = 0;
  for (const char* name : {"data.mdb"}) {
    const auto n = fs::file_size(fs::path(o.to) / name, ec);
    if (!ec) disk_bytes += n;
  }
  std::printf(
      "converted %lld records (%lld classes, %s %s, %s) from %s '%s'\n"
      "  values %.1f MB, data.mdb %.1f MB, %.2f s, %.0f records/s\n"
      "  output: %s\n",
      static_cast<long long>(written), static_cast<long long>(classes), o.format.c_str(),
      o.encoded ? "encoded" : "raw", o.shuffle ? StrCat("shuffled, seed ", o.seed).c_str() : "in order",
      o.from.c_str(), o.src.c_str(), value_bytes / 1e6, disk_bytes / 1e6, seconds,
      seconds > 0 ? written / seconds : 0.0, o.to.c_str());
  return 0;
}

}  // namespace

int RunConvert(const std::vector<std::string>& args) {
  ConvertOptions options;
  try {
    options = ParseArgs(args);
  } catch (const UsageError& e) {
    const bool help = e.what()[0] == '\0';
    if (!help) std::fprintf(stderr, "cnnflow convert: %s\n\n", e.what());
    std::fputs(kConvertUsage, help ? stdout : stderr);
    return help ? 0 : 2;
  }
  try {
    return Convert(options);
  } catch (const std::exception& e) {
    // On a terminal a progress line may be open: start a fresh one.
    std::fprintf(stderr, "%scnnflow convert: error: %s\n", isatty(fileno(stderr)) ? "\n" : "",
                 e.what());
    return 1;
  }
}

}  // namespace cnnflow
