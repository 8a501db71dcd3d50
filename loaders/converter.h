// Converting a data set (an image folder or IDX files) into a new LMDB of
// records (record.h), like Caffe's convert_imageset: the library behind
// `cnnflow convert`, which only parses flags, draws progress and prints the
// summary. Images are read by their magic bytes (JPEG or PNG, image_decoder.h)
// and either kept as they are (encoded) or decoded to raw uint8 CHW pixels;
// an optional resize gives every image the same exact size.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cnnflow {

struct ConvertOptions {
  std::string from;                // "folder" (SRC/<class>/<image>) or "idx"
  std::string src;                 // the folder root, or the IDX images file
  std::string labels;              // the IDX labels file (idx only)
  std::string to;                  // the new LMDB directory
  std::string format = "cnnflow";  // record layout: "cnnflow" or "caffe" (Datum)
  // 1: keep the image files' bytes (JPEG / PNG); 0: raw uint8 CHW pixels;
  // -1: the source's default (folder: encoded; idx: raw, the only choice).
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
};

struct ConvertSummary {
  int64_t records = 0;
  int64_t classes = 0;
  bool encoded = false;      // records hold image files' bytes, not raw pixels
  bool reencoded = false;    // resized images were re-encoded as JPEG (jpeg_quality)
  uint64_t value_bytes = 0;  // the values written
  uint64_t disk_bytes = 0;   // data.mdb's size
  double seconds = 0;
};

// Called after each record is written: (records written, records to write).
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
// source or output, naming the file (an unreadable image, a corrupt one, an
// existing output without overwrite).
ConvertSummary ConvertToLmdb(const ConvertOptions& options,
                             const ConvertProgressFn& progress = nullptr);

}  // namespace cnnflow
