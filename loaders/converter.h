// Converting a data set (an image folder, IDX files, a UCR/UEA .ts file or a
// folder of WAV files) into a new LMDB of records (record.h), like Caffe's
// convert_imageset: the library behind `cnnflow convert`, which only parses
// flags, draws progress and prints the summary. Images are read by their
// magic bytes (JPEG or PNG, image_decoder.h) and either kept as they are
// (encoded) or decoded to raw uint8 CHW pixels; an optional resize gives
// every image the same exact size. Series (ts, wav) become raw f32 [C, L]
// records at their own length (cnnflow layout only: a Caffe Datum is an
// image), fitted to the sample length when read (series_fit.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cnnflow {

struct ConvertOptions {
  // "folder" (SRC/<class>/<image>), "idx", "ts" (SRC = a .ts file) or
  // "wav" (SRC = a folder of .wav files).
  std::string from;
  std::string src;     // the folder root, the IDX images file, the .ts file
  std::string labels;  // the IDX labels file (idx only)
  // wav only (wav_dataset.h ScanWavFolder): the class from the file name
  // (first capture group), and the files to convert (empty: all).
  std::string label_regex = "^([^_]+)_";
  std::string select;
  std::string to;                  // the new LMDB directory
  std::string format = "cnnflow";  // record layout: "cnnflow" or "caffe" (Datum)
  // 1: keep the image files' bytes (JPEG / PNG); 0: raw uint8 CHW pixels;
  // -1: the source's default (folder: encoded; idx, ts, wav: raw, the only
  // choice).
  int encoded = -1;
  bool shuffle = false;  // write in a random order (Fisher-Yates with Rng(seed))
  uint64_t seed = 0;
  int64_t limit = -1;      // >= 0: write only the first `limit` records (after shuffling)
  bool overwrite = false;  // replace `to` if it exists (else that is an error)
  // Both > 0: resize every image to exactly resize_h x resize_w (as Caffe's
  // --resize_height/--resize_width; aspect ratio not kept) with cv::resize,
  // INTER_AREA when neither side grows, else INTER_LINEAR. Encoded records
  // are then re-encoded as JPEG of `jpeg_quality` (TurboJPEG, 4:2:0), PNGs
  // included.
  int resize_h = 0;
  int resize_w = 0;
  int jpeg_quality = 95;
  // A file that cannot be read or decoded (an image, a WAV): false stops
  // the conversion with an Error naming it (the default); true leaves it
  // out and lists it in ConvertSummary::skipped, as Caffe's
  // convert_imageset skips unreadable images. --limit counts before skips.
  bool skip_bad = false;
};

struct ConvertSummary {
  int64_t records = 0;
  int64_t classes = 0;
  bool encoded = false;      // records hold image files' bytes, not raw pixels
  bool reencoded = false;    // resized images were re-encoded as JPEG (jpeg_quality)
  uint64_t value_bytes = 0;  // the values written
  uint64_t disk_bytes = 0;   // data.mdb's size
  double seconds = 0;
  // With skip_bad: each file left out and why ("'a/b.jpg': corrupt JPEG: ...").
  std::vector<std::string> skipped;
};

// Called after each record is written or skipped: (records done, records to write).
using ConvertProgressFn = std::function<void(int64_t done, int64_t total)>;

// Fills `encoded` from the source's default and checks the options. Throws
// ConfigError naming the option for a missing or invalid one.
void ValidateConvertOptions(ConvertOptions* options);

// The source indices to write, in order: 0..n-1, shuffled (Fisher-Yates with
// Rng(seed)) if asked, then cut to `limit` (< 0: all). Record k of the LMDB
// (key LmdbWriter::IndexKey(k)) is source item order[k].
std::vector<int64_t> ConvertWriteOrder(int64_t n, bool shuffle, uint64_t seed, int64_t limit);

// Writes the LMDB (as `to`.tmp, renamed when done: no partial data set is
// left on failure). Throws ConfigError for bad options, Error for a bad
// source or output, naming the file (an unreadable image, a corrupt one,
// unless skip_bad; an existing output without overwrite).
ConvertSummary ConvertToLmdb(const ConvertOptions& options,
                             const ConvertProgressFn& progress = nullptr);

}  // namespace cnnflow
