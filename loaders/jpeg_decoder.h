// JPEG decoding (and encoding, for tests and the converter) over
// libjpeg-turbo's TurboJPEG API (the 2.x tj* functions: Debian 12 ships
// 2.1.5). Decodes straight into a caller's HWC uint8 buffer, with optional
// DCT-domain downscaling, and reports bad data as a value, never an
// exception: the loader stage decides whether to skip or fail.
//
// Threads: a JpegDecoder owns one TurboJPEG handle and is NOT thread-safe.
// Use one per thread: construct one per worker, or call
// ThreadLocalJpegDecoder(), which gives each thread its own (created on
// first use, destroyed at thread exit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cnnflow {

// What a header read or a decode found. On failure `error` says why and the
// other fields are unspecified.
struct JpegResult {
  int width = 0;
  int height = 0;
  // ReadHeader: channels in the file (1 gray, 3 colour, 4 CMYK/YCCK).
  // Decode: the channels written (out_channels).
  int channels = 0;
  // Decode: the DCT scaling factor used (scale_num / scale_denom).
  int scale_num = 1;
  int scale_denom = 1;
  // Empty on success. Messages: "empty JPEG buffer", "corrupt JPEG header:
  // <libjpeg text>" (also for bytes that are not a JPEG at all), "corrupt
  // JPEG: <libjpeg text>", "JPEG destination buffer too small: ...",
  // "invalid JPEG request: ...".
  std::string error;
  // Lenient mode only (JpegDecodeOptions::warnings_are_errors = false): the
  // image was decoded but libjpeg warned (e.g. "Premature end of JPEG file"
  // for a truncated file, whose missing part is filled with grey).
  std::string warning;

  bool ok() const { return error.empty(); }
};

// A DCT scaling factor and the image size it gives.
struct JpegScale {
  int num = 1;
  int denom = 1;
  int width = 0;
  int height = 0;
};

struct JpegDecodeOptions {
  // libjpeg-turbo decodes a truncated or slightly corrupt file "with a
  // warning" and fills what is missing with grey. Such a sample is garbage
  // for training, so by default a warning is an error (and decoding stops at
  // once: TJFLAG_STOPONWARNING). Set false to get the image plus
  // JpegResult::warning instead.
  bool warnings_are_errors = true;
  // Faster, slightly less accurate integer IDCT (TJFLAG_FASTDCT); off by
  // default so pixels match PIL / libjpeg's defaults.
  bool fast_dct = false;
};

class JpegDecoder {
 public:
  explicit JpegDecoder(JpegDecodeOptions options = {});
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;
  JpegDecoder(JpegDecoder&& other) noexcept;
  JpegDecoder& operator=(JpegDecoder&& other) noexcept;

  const JpegDecodeOptions& options() const { return options_; }
  void set_options(const JpegDecodeOptions& options) { options_ = options; }

  // Reads the header only: width, height, channels in the file.
  JpegResult ReadHeader(const uint8_t* data, size_t size);

  // Decodes into dst as HWC uint8 [height, width, out_channels], rows packed
  // (pitch = width * out_channels). out_channels: 1 (gray; a colour JPEG
  // gives its luma) or 3 (RGB; a gray JPEG is replicated). With
  // target_min_side > 0 the image is downscaled in the DCT domain by the
  // smallest factor whose min side stays >= target_min_side (see PickScale);
  // 0 decodes at full size. Needs dst_capacity >= width * height *
  // out_channels of the (scaled) result; ReadHeader + PickScale size it.
  JpegResult Decode(const uint8_t* data, size_t size, int out_channels, uint8_t* dst,
                    size_t dst_capacity, int target_min_side = 0);

  // The smallest TurboJPEG scaling factor of 1/8, 1/4, 1/2 and 1 whose
  // scaled min(width, height) is >= target_min_side; 1/1 when target_min_side
  // <= 0 or no factor below 1 reaches it. Never upscales. (The M/8 factors
  // between are left out: libjpeg-turbo decodes them with a scalar IDCT,
  // slower than the full-size SIMD decode and a resize.)
  static JpegScale PickScale(int width, int height, int target_min_side);

 private:
  void ResetHandle();

  void* handle_ = nullptr;  // tjhandle
  JpegDecodeOptions options_;
};

// This thread's decoder (default options unless the caller changes them via
// set_options). Valid until the thread exits.
JpegDecoder& ThreadLocalJpegDecoder();

// Encodes HWC uint8 [height, width, channels] (channels 1 or 3, RGB) as a
// baseline JPEG. quality 1..100; subsample_chroma picks 4:2:0 (as PIL and
// most cameras) over 4:4:4 for colour. Throws cnnflow::Error on bad
// arguments (a programming error, not bad data). Thread-safe (a thread-local
// handle).
std::string EncodeJpeg(const uint8_t* pixels, int width, int height, int channels, int quality = 95,
                       bool subsample_chroma = true);

}  // namespace cnnflow
