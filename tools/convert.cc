#include "tools/convert.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "loaders/converter.h"
#include "ops/error.h"
#include "pipeline/progress.h"
#include "tools/command_line.h"

namespace cnnflow {
namespace {

constexpr const char* kConvertUsage =
    R"(usage: cnnflow convert --from folder|idx|ts|wav SRC --to LMDB_DIR [options]

  --from folder SRC   SRC/<class>/<image>: .jpg/.jpeg/.png, classes sorted by name
  --from idx SRC      SRC = IDX images file (gzip or plain); needs --labels
  --from ts SRC       SRC = a UCR/UEA .ts file: raw f32 [C, L] records, one per
                      case at its own length, label = index in @classLabel
  --from wav SRC      SRC = a folder of 16-bit PCM .wav files: raw f32 [1, L]
                      records (stereo averaged), classes from the file names
  --label-regex R     wav: the class is R's first capture group in the file
                      name (default '^([^_]+)_'; classes sorted as numbers if
                      all are integers, else by name)
  --select R          wav: convert only the files whose name matches R
                      (FSDD test split: '_[0-4]\.wav$')
  --to LMDB_DIR       the new LMDB (written as LMDB_DIR.tmp, renamed when done)
  --labels FILE       IDX labels file (idx only)
  --format F          record layout: cnnflow (default) or caffe (Datum
                      protobuf; images only)
  --encoded           keep the image file's bytes (JPEG/PNG) as they are
                      (the default for folders)
  --raw               decode to raw uint8 CHW pixels (JPEG or PNG; default for idx)
  --resize H,W        resize every image to exactly H x W (aspect not kept; as
                      convert_imageset's --resize_height/--resize_width):
                      INTER_AREA when shrinking, else INTER_LINEAR; with
                      --encoded the result is re-encoded as JPEG quality 95
  --shuffle           write the records in a random order (Fisher-Yates)
  --seed N            seed of --shuffle (default 0)
  --limit N           write only the first N records (after shuffling)
  --overwrite         replace LMDB_DIR if it exists
  --on-bad fail|skip  an image or WAV file that cannot be read or decoded: stop
                      with its error (fail, the default), or leave it out and
                      list it with its error at the end (skip, as Caffe's
                      convert_imageset)
)";

ConvertOptions ParseArgs(const std::vector<std::string>& args) {
  ConvertOptions o;
  CommandLine cmd(args);
  while (cmd.Next()) {
    if (cmd.Is("--from")) {
      o.from = cmd.Value();
    } else if (cmd.Is("--to")) {
      o.to = cmd.Value();
    } else if (cmd.Is("--labels")) {
      o.labels = cmd.Value();
    } else if (cmd.Is("--label-regex")) {
      o.label_regex = cmd.Value();
    } else if (cmd.Is("--select")) {
      o.select = cmd.Value();
    } else if (cmd.Is("--format")) {
      o.format = cmd.Value();
    } else if (cmd.Is("--seed")) {
      o.seed = static_cast<uint64_t>(cmd.Count(0));
    } else if (cmd.Is("--limit")) {
      o.limit = cmd.Count(0);
    } else if (cmd.Is("--resize")) {
      const std::vector<int64_t> hw = cmd.CountList(1);
      if (hw.size() != 2) throw UsageError("--resize expects H,W");
      o.resize_h = static_cast<int>(std::min<int64_t>(hw[0], 1 << 30));
      o.resize_w = static_cast<int>(std::min<int64_t>(hw[1], 1 << 30));
    } else if (cmd.Is("--on-bad")) {
      const std::string v = cmd.Value();
      if (v != "fail" && v != "skip")
        throw UsageError(StrCat("--on-bad expects fail or skip, got '", v, "'"));
      o.skip_bad = v == "skip";
    } else if (cmd.Is("--encoded")) {
      o.encoded = 1;
    } else if (cmd.Is("--raw")) {
      o.encoded = 0;
    } else if (cmd.Is("--shuffle")) {
      o.shuffle = true;
    } else if (cmd.Is("--overwrite")) {
      o.overwrite = true;
    } else if (cmd.Is("-h", "--help")) {
      throw UsageError("");  // RunConvert prints the usage and returns 0
    } else if (!cmd.IsOption() && o.src.empty()) {
      o.src = cmd.arg();
    } else {
      cmd.Reject();
    }
  }
  try {
    ValidateConvertOptions(&o);  // the library's checks, reported as usage errors
  } catch (const ConfigError& e) {
    throw UsageError(e.what());
  }
  return o;
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

int Convert(const ConvertOptions& o) {
  std::unique_ptr<ConvertProgress> bar;  // made when the total is known
  const auto start = std::chrono::steady_clock::now();
  const ConvertSummary sum = ConvertToLmdb(o, [&](int64_t done, int64_t total) {
    if (!bar) bar = std::make_unique<ConvertProgress>(total);
    bar->Update(done,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  });
  if (bar) bar->End();
  std::string layout = StrCat(o.format, " ", sum.encoded ? "encoded" : "raw");
  if (o.from == "ts" || o.from == "wav") layout += " f32 [C, L] series";
  if (o.resize_h > 0) {
    layout += StrCat(", resized to ", o.resize_h, "x", o.resize_w);
    if (sum.reencoded) layout += StrCat(" (re-encoded as JPEG quality ", o.jpeg_quality, ")");
  }
  std::printf(
      "converted %lld records (%lld classes, %s, %s) from %s '%s'\n"
      "  values %.1f MB, data.mdb %.1f MB, %.2f s, %.0f records/s\n"
      "  output: %s\n",
      static_cast<long long>(sum.records), static_cast<long long>(sum.classes), layout.c_str(),
      o.shuffle ? StrCat("shuffled, seed ", o.seed).c_str() : "in order", o.from.c_str(),
      o.src.c_str(), sum.value_bytes / 1e6, sum.disk_bytes / 1e6, sum.seconds,
      sum.seconds > 0 ? sum.records / sum.seconds : 0.0, o.to.c_str());
  if (!sum.skipped.empty()) {
    std::printf("skipped %zu unreadable file(s) (--on-bad skip):\n", sum.skipped.size());
    for (const std::string& s : sum.skipped) std::printf("  %s\n", s.c_str());
  }
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
