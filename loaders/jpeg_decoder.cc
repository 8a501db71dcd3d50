#include "loaders/jpeg_decoder.h"

#include <turbojpeg.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "ops/error.h"

namespace cnnflow {
namespace {

int FileChannels(int colorspace) {
  switch (colorspace) {
    case TJCS_GRAY:
      return 1;
    case TJCS_CMYK:
    case TJCS_YCCK:
      return 4;
    default:
      return 3;
  }
}

// Limits on what a data record may ask of the decoder: a corrupt header
// claiming 60000x60000 must fail, not allocate or spin.
constexpr int kMaxSide = 1 << 15;
// And its pixels must fit its bytes: a 1 KB file whose frame header says
// 30000x30000 would have the caller allocate 2.7 GB for the pixels (and a
// progressive decode, libjpeg 2 bytes per coefficient) before the decode
// finds the data short (found by fuzz/, fuzz_image). A baseline JPEG needs
// at least 2 bits per 8x8 block (a DC code and an end-of-block code), ~1:700
// at 4:2:0; progressive end-of-band runs and arithmetic coding can go far
// beyond, so the bound is generous: up to 64 MiB of pixels always, beyond
// that at most 2048 pixel bytes per file byte (a real 8000x6000 photo is
// 144 MB from some MB of file).
constexpr uint64_t kAlwaysPlausibleBytes = uint64_t{64} << 20;
constexpr uint64_t kMaxBytesPerFileByte = 2048;

// The frame size and component count, read by walking the marker segments
// up to the first scan (SOS), as libjpeg's header parse finds them, but
// without building its tables: for a 32x32 CIFAR image that parse costs a
// third of the decode, and tjDecompress2 parses the header again anyway.
// Only the plain cases: one 8-bit baseline, extended or progressive frame
// (SOF0-2) with 1, 3 or 4 components before a complete SOS header. Anything
// else returns false, and the caller asks libjpeg, which also words the
// error. Bad tables or entropy data still fail, in tjDecompress2.
// *components: 1 gray, 3 YCbCr or RGB, 4 CMYK or YCCK, as FileChannels classes them.
bool ScanFrameHeader(const uint8_t* p, size_t n, int* width, int* height, int* components) {
  if (n < 4 || p[0] != 0xFF || p[1] != 0xD8) return false;
  bool frame = false;
  size_t i = 2;
  while (i + 4 <= n) {
    if (p[i] != 0xFF) return false;
    const uint8_t marker = p[i + 1];
    if (marker == 0xFF) {  // a fill byte before the marker
      ++i;
      continue;
    }
    const size_t len = size_t{p[i + 2]} << 8 | p[i + 3];
    if (len < 2 || i + 2 + len > n) return false;
    const uint8_t* s = p + i + 4;
    if (marker == 0xC0 || marker == 0xC1 || marker == 0xC2) {
      if (frame || len < 8) return false;
      *height = s[1] << 8 | s[2];
      *width = s[3] << 8 | s[4];
      *components = s[5];
      if (s[0] != 8 || len != 8 + 3 * size_t{s[5]} || *width == 0 || *height == 0 ||
          (*components != 1 && *components != 3 && *components != 4)) {
        return false;
      }
      frame = true;
    } else if (marker == 0xDA) {
      return frame;  // the SOS header is complete (len fits): the scan follows
    } else if (marker == 0xD8 || marker == 0xD9 || marker == 0x01 ||
               (marker >= 0xD0 && marker <= 0xD7) ||
               (marker >= 0xC3 && marker <= 0xCF && marker != 0xC4 && marker != 0xCC)) {
      return false;  // SOI/EOI/TEM/RSTn out of place, or a frame type for libjpeg to judge
    }
    i += 2 + len;
  }
  return false;
}

}  // namespace

JpegDecoder::JpegDecoder(JpegDecodeOptions options) : options_(options) {
  handle_ = tjInitDecompress();
  CNNFLOW_ENFORCE(handle_ != nullptr, "tjInitDecompress failed: ", tjGetErrorStr2(nullptr));
}

JpegDecoder::~JpegDecoder() {
  if (handle_ != nullptr) tjDestroy(static_cast<tjhandle>(handle_));
}

JpegDecoder::JpegDecoder(JpegDecoder&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), options_(other.options_) {}

JpegDecoder& JpegDecoder::operator=(JpegDecoder&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) tjDestroy(static_cast<tjhandle>(handle_));
    handle_ = std::exchange(other.handle_, nullptr);
    options_ = other.options_;
  }
  return *this;
}

void JpegDecoder::ResetHandle() {
  tjhandle fresh = tjInitDecompress();
  CNNFLOW_ENFORCE(fresh != nullptr, "tjInitDecompress failed: ", tjGetErrorStr2(nullptr));
  if (handle_ != nullptr) tjDestroy(static_cast<tjhandle>(handle_));
  handle_ = fresh;
}

JpegResult JpegDecoder::ReadHeader(const uint8_t* data, size_t size) {
  JpegResult r;
  if (data == nullptr || size == 0) {
    r.error = "empty JPEG buffer";
    return r;
  }
  // The cheap scan first; libjpeg's full header parse only when it declines.
  if (!ScanFrameHeader(data, size, &r.width, &r.height, &r.channels)) {
    tjhandle h = static_cast<tjhandle>(handle_);
    int subsamp = 0, colorspace = 0;
    if (tjDecompressHeader3(h, data, static_cast<unsigned long>(size), &r.width, &r.height,
                            &subsamp, &colorspace) != 0) {
      r.error = StrCat("corrupt JPEG header: ", tjGetErrorStr2(h));
      // TurboJPEG 2.1 leaves the decompressor mid-header after a failed
      // tjDecompressHeader3 (no jpeg_abort), and the next header read on the
      // handle then "succeeds" with 0x0: start over with a fresh handle.
      ResetHandle();
      return r;
    }
    r.channels = FileChannels(colorspace);
  }
  if (r.width <= 0 || r.height <= 0 || r.width > kMaxSide || r.height > kMaxSide) {
    r.error = StrCat("corrupt JPEG header: image size ", r.width, "x", r.height,
                     " out of range (1..", kMaxSide, ")");
    return r;
  }
  const uint64_t pixel_bytes = uint64_t(r.width) * uint64_t(r.height) * uint64_t(r.channels);
  if (pixel_bytes > kAlwaysPlausibleBytes && pixel_bytes > kMaxBytesPerFileByte * size) {
    r.error = StrCat("corrupt JPEG header: ", r.width, "x", r.height, "x", r.channels, " is ",
                     pixel_bytes, " bytes of pixels, more than ", size,
                     " bytes of JPEG can hold (at most ", kMaxBytesPerFileByte, ":1)");
  }
  return r;
}

JpegScale JpegDecoder::PickScale(int width, int height, int target_min_side) {
  JpegScale best{1, 1, width, height};
  if (target_min_side <= 0) return best;
  int n = 0;
  const tjscalingfactor* factors = tjGetScalingFactors(&n);
  for (int i = 0; i < n; ++i) {
    const tjscalingfactor f = factors[i];
    if (f.num > f.denom) continue;  // never upscale
    // 1/2, 1/4, 1/8 only: libjpeg-turbo's SIMD serves those reduced IDCTs;
    // the M/8 ones between run its scalar IDCT, slower than a full decode
    // plus the resize (500x375 at 3/4: 1.45x slower per sample).
    if (f.num != 1) continue;
    const int w = TJSCALED(width, f), h = TJSCALED(height, f);
    if (std::min(w, h) < target_min_side) continue;
    // Smaller ratio than the best so far: f.num / f.denom < best.num / best.denom.
    if (static_cast<int64_t>(f.num) * best.denom < static_cast<int64_t>(best.num) * f.denom) {
      best = {f.num, f.denom, w, h};
    }
  }
  return best;
}

JpegResult JpegDecoder::Decode(const uint8_t* data, size_t size, int out_channels, uint8_t* dst,
                               size_t dst_capacity, int target_min_side) {
  if (out_channels != 1 && out_channels != 3) {
    JpegResult r;
    r.error = StrCat("invalid JPEG request: out_channels must be 1 or 3, got ", out_channels);
    return r;
  }
  JpegResult r = ReadHeader(data, size);
  if (!r.ok()) return r;
  const JpegScale s = PickScale(r.width, r.height, target_min_side);
  r.width = s.width;
  r.height = s.height;
  r.channels = out_channels;
  r.scale_num = s.num;
  r.scale_denom = s.denom;
  const size_t need = static_cast<size_t>(s.width) * s.height * out_channels;
  if (dst == nullptr || dst_capacity < need) {
    r.error = StrCat("JPEG destination buffer too small: ", s.width, "x", s.height, "x",
                     out_channels, " needs ", need, " bytes, have ", dst_capacity);
    return r;
  }
  // Cap progressive scans: a crafted file can otherwise take minutes.
  int flags = TJFLAG_LIMITSCANS;
  if (options_.warnings_are_errors) flags |= TJFLAG_STOPONWARNING;
  if (options_.fast_dct) flags |= TJFLAG_FASTDCT;
  tjhandle h = static_cast<tjhandle>(handle_);
  const int pixel_format = out_channels == 1 ? TJPF_GRAY : TJPF_RGB;
  if (tjDecompress2(h, data, static_cast<unsigned long>(size), dst, s.width, s.width * out_channels,
                    s.height, pixel_format, flags) != 0) {
    // Without STOPONWARNING a warning still returns -1, after a full decode.
    if (!options_.warnings_are_errors && tjGetErrorCode(h) == TJERR_WARNING) {
      r.warning = tjGetErrorStr2(h);
    } else {
      r.error = StrCat("corrupt JPEG: ", tjGetErrorStr2(h));
    }
  }
  return r;
}

JpegDecoder& ThreadLocalJpegDecoder() {
  thread_local JpegDecoder decoder;
  return decoder;
}

namespace {

struct TjDeleter {
  void operator()(void* h) const { tjDestroy(static_cast<tjhandle>(h)); }
};

}  // namespace

std::string EncodeJpeg(const uint8_t* pixels, int width, int height, int channels, int quality,
                       bool subsample_chroma) {
  CNNFLOW_ENFORCE(pixels != nullptr && width > 0 && height > 0, "EncodeJpeg: empty image ", width,
                  "x", height);
  CNNFLOW_ENFORCE(channels == 1 || channels == 3, "EncodeJpeg: channels must be 1 or 3, got ",
                  channels);
  CNNFLOW_ENFORCE(quality >= 1 && quality <= 100, "EncodeJpeg: quality must be 1..100, got ",
                  quality);
  thread_local std::unique_ptr<void, TjDeleter> handle(tjInitCompress());
  tjhandle h = static_cast<tjhandle>(handle.get());
  CNNFLOW_ENFORCE(h != nullptr, "tjInitCompress failed: ", tjGetErrorStr2(nullptr));
  const int subsamp = channels == 1 ? TJSAMP_GRAY : (subsample_chroma ? TJSAMP_420 : TJSAMP_444);
  unsigned char* out = nullptr;
  unsigned long out_size = 0;
  const int rc =
      tjCompress2(h, pixels, width, width * channels, height, channels == 1 ? TJPF_GRAY : TJPF_RGB,
                  &out, &out_size, subsamp, quality, 0);
  std::unique_ptr<unsigned char, void (*)(unsigned char*)> owned(out, tjFree);
  CNNFLOW_ENFORCE(rc == 0, "tjCompress2 failed: ", tjGetErrorStr2(h));
  return std::string(reinterpret_cast<const char*>(out), out_size);
}

}  // namespace cnnflow
