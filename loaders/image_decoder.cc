#include "loaders/image_decoder.h"

#include <png.h>

#include <algorithm>
#include <array>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>
#include <variant>

#include "loaders/jpeg_decoder.h"
#include "ops/error.h"

namespace cnnflow {
namespace {

constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

// Where libpng reads from and where its callbacks leave an error. Plain
// data only: it is touched on both sides of a longjmp.
struct PngSource {
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t pos = 0;
  bool truncated = false;
  char message[200] = {};
};

void PngRead(png_structp png, png_bytep out, size_t n) {
  auto* s = static_cast<PngSource*>(png_get_io_ptr(png));
  if (n > s->size - s->pos) {
    s->truncated = true;
    png_error(png, "unexpected end of data");  // -> PngError, does not return
  }
  std::memcpy(out, s->data + s->pos, n);
  s->pos += n;
}

// libpng's contract: an error function must not return. It longjmps back to
// the setjmp point of the PngReader method that called into libpng (a C++
// exception thrown through libpng's C frames would need libpng built with
// unwind tables, which nothing guarantees).
void PngError(png_structp png, png_const_charp message) {
  auto* s = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(s->message, sizeof(s->message), "%s", message != nullptr ? message : "error");
  png_longjmp(png, 1);
}

// Warnings (a bad ancillary chunk, an odd sRGB profile) do not stop a
// decode whose pixels are intact; libpng discards such chunks itself.
void PngWarning(png_structp, png_const_charp) {}

// Channels of a PNG colour type (palette: the RGB it expands to), 0 if the
// type is not a valid one.
int PngFileChannels(int color_type) {
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY:
      return 1;
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      return 2;
    case PNG_COLOR_TYPE_RGB:
      return 3;
    case PNG_COLOR_TYPE_PALETTE:
      return 3;
    case PNG_COLOR_TYPE_RGB_ALPHA:
      return 4;
    default:
      return 0;
  }
}

// Owns libpng's read structs for one decode. The two methods that call into
// libpng set their setjmp point first and hold only trivially destructible
// locals: a longjmp skips destructors, so none may be pending between the
// setjmp and a libpng call. Everything with a destructor lives in the
// caller's frame, which a longjmp never leaves.
class PngReader {
 public:
  PngReader(const uint8_t* data, size_t size) {
    src_.data = data;
    src_.size = size;
  }
  ~PngReader() {
    if (png_ != nullptr)
      png_destroy_read_struct(&png_, info_ != nullptr ? &info_ : nullptr, nullptr);
  }
  PngReader(const PngReader&) = delete;
  PngReader& operator=(const PngReader&) = delete;

  // Reads the header and sets the transforms: palette -> RGB, gray 1/2/4 ->
  // 8 bits, 16 -> 8 bits (high byte), alpha stripped, interlacing handled.
  // Then width(), height(), channels() (1 or 3; 2 or 4 should libpng leave
  // an alpha channel) describe the rows ReadRows writes.
  bool Start() {
    png_ = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src_, PngError, PngWarning);
    if (png_ == nullptr) return Fail("png_create_read_struct failed");
    info_ = png_create_info_struct(png_);
    if (info_ == nullptr) return Fail("png_create_info_struct failed");
    if (setjmp(png_jmpbuf(png_))) return false;
    png_set_read_fn(png_, &src_, PngRead);
    png_set_user_limits(png_, kMaxImageSide, kMaxImageSide);
    png_read_info(png_, info_);
    png_uint_32 w = 0, h = 0;
    int depth = 0, color = 0;
    png_get_IHDR(png_, info_, &w, &h, &depth, &color, nullptr, nullptr, nullptr);
    // A corrupt header must not make us allocate gigabytes: deflate expands
    // at most ~1032:1, so the pixel bits of a real image fit in that much
    // of the file.
    const uint64_t pixel_bytes =
        uint64_t{w} * h * static_cast<uint64_t>(depth * PngFileChannels(color)) / 8;
    if (pixel_bytes > uint64_t{1100} * src_.size + 4096) {
      std::snprintf(src_.message, sizeof(src_.message),
                    "header claims %ux%u pixels, more than %zu bytes of data can hold",
                    static_cast<unsigned>(w), static_cast<unsigned>(h), src_.size);
      return false;
    }
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png_);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png_);
    if (depth == 16) png_set_strip_16(png_);
    png_set_strip_alpha(png_);  // also drops an expanded palette tRNS
    passes_ = png_set_interlace_handling(png_);
    png_read_update_info(png_, info_);
    width_ = static_cast<int>(w);
    height_ = static_cast<int>(h);
    channels_ = png_get_channels(png_, info_);
    if (png_get_bit_depth(png_, info_) != 8 || channels_ < 1 || channels_ > 4 ||
        png_get_rowbytes(png_, info_) != static_cast<size_t>(width_) * channels_) {
      return Fail("unsupported pixel layout after transforms");
    }
    return true;
  }

  // Decodes every row (all interlace passes) into dst, rows of width() *
  // channels() bytes.
  bool ReadRows(uint8_t* dst) {
    if (setjmp(png_jmpbuf(png_))) return false;
    const size_t stride = static_cast<size_t>(width_) * channels_;
    for (int pass = 0; pass < passes_; ++pass) {
      for (int y = 0; y < height_; ++y) png_read_row(png_, dst + y * stride, nullptr);
    }
    return true;
  }

  int width() const { return width_; }
  int height() const { return height_; }
  int channels() const { return channels_; }

  std::string error() const {
    if (src_.truncated) return StrCat("truncated PNG: the data ends after ", src_.size, " bytes");
    return StrCat("corrupt PNG: ", src_.message);
  }

 private:
  bool Fail(const char* message) {
    std::snprintf(src_.message, sizeof(src_.message), "%s", message);
    return false;
  }

  PngSource src_;
  png_structp png_ = nullptr;
  png_infop info_ = nullptr;
  int width_ = 0, height_ = 0, channels_ = 0, passes_ = 1;
};

uint8_t Luma(const uint8_t* rgb) {  // OpenCV's fixed-point RGB2GRAY
  return static_cast<uint8_t>((4899 * rgb[0] + 9617 * rgb[1] + 1868 * rgb[2] + 8192) >> 14);
}

}  // namespace

void ConvertImageChannels(uint8_t* buf, size_t pixels, int from, int to) {
  if (from == to) return;
  if (to == 3 && from <= 2) {  // gray -> RGB: grows, so back to front
    for (size_t i = pixels; i-- > 0;) {
      const uint8_t g = buf[i * from];
      buf[i * 3] = buf[i * 3 + 1] = buf[i * 3 + 2] = g;
    }
    return;
  }
  for (size_t i = 0; i < pixels; ++i) {  // shrinks: front to back
    const uint8_t* p = buf + i * from;
    if (to == 1) {
      buf[i] = from <= 2 ? p[0] : Luma(p);
    } else {  // RGBA -> RGB
      const uint8_t r = p[0], g = p[1], b = p[2];
      buf[i * 3] = r;
      buf[i * 3 + 1] = g;
      buf[i * 3 + 2] = b;
    }
  }
}

namespace {

// Walks the chunk list up to IEND: each chunk's stated length must fit in
// the bytes left. libpng allocates a text chunk whole before reading it
// (png_set_chunk_malloc_max does not bound that in Debian's 1.6.39), so a
// 460-byte file whose tEXt chunk claims 1.6 GB made it allocate 1.6 GB
// (found by fuzz/, fuzz_image). "" or what is wrong.
std::string CheckPngChunks(const uint8_t* data, size_t size) {
  size_t pos = 8;  // after the signature
  while (size - pos >= 8) {
    const uint64_t length = uint64_t{data[pos]} << 24 | uint64_t{data[pos + 1]} << 16 |
                            uint64_t{data[pos + 2]} << 8 | uint64_t{data[pos + 3]};
    std::string type;
    for (int i = 4; i < 8; ++i) {
      const uint8_t c = data[pos + i];
      type += (c >= 32 && c < 127) ? static_cast<char>(c) : '?';
    }
    const size_t left = size - pos - 8;
    if (length + 4 > left) {  // the data and its CRC
      return StrCat("truncated PNG: the data ends after ", size, " bytes, inside chunk '", type,
                    "' at byte ", pos, " (", length, " bytes + 4 of CRC)");
    }
    if (type == "IEND") return "";
    pos += 8 + static_cast<size_t>(length) + 4;
  }
  return "";  // no IEND: libpng reports what it misses
}

ImageResult ReadPngHeader(const uint8_t* data, size_t size);

ImageResult DecodePng(const uint8_t* data, size_t size, int out_channels,
                      std::vector<uint8_t>* hwc) {
  // The header first, as ReadImageHeader reads it: libpng skips an unknown
  // ancillary chunk before IHDR (an "iHDR", found by fuzz_image), which the
  // PNG spec forbids and the header reader rejects; both must agree.
  ImageResult r = ReadPngHeader(data, size);
  if (!r.ok()) return r;
  r = ImageResult();
  r.format = ImageFormat::kPng;
  r.error = CheckPngChunks(data, size);
  if (!r.error.empty()) return r;
  PngReader reader(data, size);
  if (!reader.Start()) {
    r.error = reader.error();
    return r;
  }
  const int decoded = reader.channels();
  const int out = out_channels != 0 ? out_channels : DefaultImageChannels(decoded);
  const size_t pixels = static_cast<size_t>(reader.width()) * reader.height();
  hwc->resize(pixels * std::max(decoded, out));
  if (!reader.ReadRows(hwc->data())) {
    r.error = reader.error();
    return r;
  }
  ConvertImageChannels(hwc->data(), pixels, decoded, out);
  hwc->resize(pixels * out);
  r.width = reader.width();
  r.height = reader.height();
  r.channels = out;
  return r;
}

ImageResult ReadPngHeader(const uint8_t* data, size_t size) {
  ImageResult r;
  r.format = ImageFormat::kPng;
  // Signature (8), IHDR length (4) and type (4), then 13 bytes of fields.
  if (size < 8 + 8 + 13) {
    r.error = StrCat("truncated PNG: ", size, " bytes is shorter than the header");
    return r;
  }
  auto be32 = [&](size_t off) {
    return uint32_t{data[off]} << 24 | uint32_t{data[off + 1]} << 16 |
           uint32_t{data[off + 2]} << 8 | uint32_t{data[off + 3]};
  };
  if (be32(8) != 13 || std::memcmp(data + 12, "IHDR", 4) != 0) {
    r.error = "corrupt PNG: the first chunk is not a 13-byte IHDR";
    return r;
  }
  const uint32_t w = be32(16), h = be32(20);
  const int depth = data[24], color = data[25];
  if (w == 0 || h == 0 || w > kMaxImageSide || h > kMaxImageSide) {
    r.error =
        StrCat("corrupt PNG: image size ", w, "x", h, " out of range (1..", kMaxImageSide, ")");
    return r;
  }
  const bool depth_ok = depth == 8 || depth == 16 ||
                        ((depth == 1 || depth == 2 || depth == 4) &&
                         (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_PALETTE));
  if (PngFileChannels(color) == 0 || !depth_ok ||
      (color == PNG_COLOR_TYPE_PALETTE && depth == 16)) {
    r.error = StrCat("corrupt PNG: invalid colour type ", color, " with bit depth ", depth);
    return r;
  }
  r.width = static_cast<int>(w);
  r.height = static_cast<int>(h);
  r.channels = PngFileChannels(color);
  return r;
}

std::string UnknownFormat(const uint8_t* data, size_t size) {
  if (data == nullptr || size == 0) return "empty image data";
  std::string hex;
  char b[4];
  for (size_t i = 0; i < std::min<size_t>(size, 4); ++i) {
    std::snprintf(b, sizeof(b), i == 0 ? "%02x" : " %02x", data[i]);
    hex += b;
  }
  return StrCat("unknown image format (the data starts with ", hex, "): expected JPEG or PNG");
}

ImageResult FromJpeg(const JpegResult& j) {
  ImageResult r;
  r.format = ImageFormat::kJpeg;
  r.width = j.width;
  r.height = j.height;
  r.channels = j.channels;
  r.error = j.error;
  return r;
}

}  // namespace

const char* ImageFormatName(ImageFormat f) {
  switch (f) {
    case ImageFormat::kJpeg:
      return "jpeg";
    case ImageFormat::kPng:
      return "png";
    default:
      return "unknown";
  }
}

ImageFormat DetectImageFormat(const uint8_t* data, size_t size) {
  if (data == nullptr) return ImageFormat::kUnknown;
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return ImageFormat::kJpeg;
  if (size >= 8 && std::memcmp(data, kPngSignature, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

int DefaultImageChannels(int file_channels) { return file_channels <= 2 ? 1 : 3; }

ImageResult ReadImageHeader(const uint8_t* data, size_t size) {
  switch (DetectImageFormat(data, size)) {
    case ImageFormat::kJpeg:
      return FromJpeg(ThreadLocalJpegDecoder().ReadHeader(data, size));
    case ImageFormat::kPng:
      return ReadPngHeader(data, size);
    default: {
      ImageResult r;
      r.error = UnknownFormat(data, size);
      return r;
    }
  }
}

ImageResult DecodeImage(const uint8_t* data, size_t size, int out_channels,
                        std::vector<uint8_t>* hwc, int target_min_side) {
  if (out_channels != 0 && out_channels != 1 && out_channels != 3) {
    ImageResult r;
    r.error = StrCat("invalid image request: out_channels must be 0, 1 or 3, got ", out_channels);
    return r;
  }
  switch (DetectImageFormat(data, size)) {
    case ImageFormat::kJpeg: {
      JpegDecoder& decoder = ThreadLocalJpegDecoder();
      const JpegResult header = decoder.ReadHeader(data, size);
      if (!header.ok()) return FromJpeg(header);
      const int out = out_channels != 0 ? out_channels : DefaultImageChannels(header.channels);
      const JpegScale s = JpegDecoder::PickScale(header.width, header.height, target_min_side);
      hwc->resize(static_cast<size_t>(s.width) * s.height * out);
      return FromJpeg(decoder.Decode(data, size, out, hwc->data(), hwc->size(), target_min_side));
    }
    case ImageFormat::kPng:
      return DecodePng(data, size, out_channels, hwc);
    default: {
      ImageResult r;
      r.error = UnknownFormat(data, size);
      return r;
    }
  }
}

namespace {

PadMode ParsePadMode(const std::string& s) {
  if (s == "zero") return PadMode::kZero;
  if (s == "reflect") return PadMode::kReflect;
  throw ConfigError(StrCat("pad_mode: expected zero or reflect, got '", s, "'"));
}

// hflip: a config gives a string (the schema's choice: YAML's true and false
// read as "true" and "false"); code may set a bool.
void SetFlip(const Args& args, AugmentOptions* o) {
  if (!args.Has("hflip")) throw Error("parameter 'hflip' is not set");
  const ParamValue& v = args.values().at("hflip");
  if (const bool* b = std::get_if<bool>(&v)) {
    o->hflip = *b;
    return;
  }
  const std::string* s = std::get_if<std::string>(&v);
  if (s != nullptr && (*s == "false" || *s == "true" || *s == "alternate")) {
    o->hflip = *s != "false";
    o->alternate_flip = *s == "alternate";
    return;
  }
  throw ConfigError(StrCat("hflip: expected true, false or alternate, got ",
                           s != nullptr ? "'" + *s + "'" : ParamValueToString(v)));
}

// A [lo, hi] list key.
std::array<double, 2> Pair(const Args& args, const std::string& key) {
  const std::vector<double> v = args.Floats(key);
  if (v.size() != 2) {
    throw ConfigError(StrCat(key, ": expected [lo, hi], got ", v.size(), " values"));
  }
  return {v[0], v[1]};
}

}  // namespace

Schema AddImageAugmentParams(Schema schema) {
  schema.Optional("pad", ParamType::kInt, int64_t{0}, "padding on every side before a random crop")
      .Choice("pad_mode", {"zero", "reflect"}, "zero",
              "how the padding is filled: zeros, or the image mirrored without repeating its "
              "edge (numpy.pad 'reflect'; needs pad < the image's sides)")
      .Optional("random_crop", ParamType::kBool, false, "random crop (else centre crop)")
      .Choice("hflip", {"false", "true", "alternate"}, "false",
              "horizontal flip: true flips each sample with p = 0.5 drawn per epoch; alternate "
              "draws it once per sample and flips it the other way every odd epoch (airbench)")
      .Optional("resize_min_side", ParamType::kInt, int64_t{0},
                "resize so the shorter side is this before cropping (0: no resize; JPEGs are "
                "first downscaled in the DCT domain as far as this allows)")
      .Optional("random_resized_crop", ParamType::kBool, false,
                "torchvision's RandomResizedCrop in place of pad and random_crop: a random region "
                "(crop_scale, crop_ratio) resized to the sample's size")
      .Optional("crop_scale", ParamType::kFloatList, std::vector<double>{0.08, 1.0},
                "random_resized_crop: [lo, hi] of the region's fraction of the image's area")
      .Optional("crop_ratio", ParamType::kFloatList, std::vector<double>{3.0 / 4.0, 4.0 / 3.0},
                "random_resized_crop: [lo, hi] of the region's aspect ratio (w / h), drawn "
                "log-uniform")
      .Optional("erase", ParamType::kFloat, 0.0,
                "RandomErasing's probability (torchvision's, after normalisation: a rectangle "
                "set to 0; 0: off)")
      .Optional("erase_scale", ParamType::kFloatList, std::vector<double>{0.02, 0.33},
                "RandomErasing: [lo, hi] of the erased area's fraction of the sample")
      .Optional("erase_ratio", ParamType::kFloatList, std::vector<double>{0.3, 3.3},
                "RandomErasing: [lo, hi] of the erased rectangle's aspect ratio (h / w), drawn "
                "log-uniform")
      .Optional("trivial_augment", ParamType::kBool, false,
                "torchvision's TrivialAugmentWide() after the crop and flip: one of 14 ops "
                "(shear, translate, rotate, colour, posterize, ...) at a random magnitude")
      .Optional("color_jitter", ParamType::kFloatList, std::vector<double>{0, 0, 0, 0},
                "torchvision's ColorJitter(brightness, contrast, saturation, hue) after "
                "trivial_augment, in a random order: [b, c, s, h] (1 to 4 values, the rest 0; "
                "b, c, s >= 0, h <= 0.5; 0: that op off)");
  return schema;
}

ImageSampleDecoder::ImageSampleDecoder(const Shape& shape, const Args& args) {
  if (shape.rank() != 3 || (shape[0] != 1 && shape[0] != 3) || shape[1] <= 0 || shape[2] <= 0) {
    throw ConfigError(StrCat("image samples need shape [C, H, W] with C 1 or 3, got ", shape));
  }
  channels_ = static_cast<int>(shape[0]);
  resize_min_side_ = static_cast<int>(args.Int("resize_min_side"));
  AugmentOptions o;
  o.out_h = static_cast<int>(shape[1]);
  o.out_w = static_cast<int>(shape[2]);
  o.resize_min_side = resize_min_side_;
  eval_options_ = o;  // centre crop, no flip, no padding
  o.pad = static_cast<int>(args.Int("pad"));
  o.pad_mode = ParsePadMode(args.String("pad_mode"));
  o.random_crop = args.Bool("random_crop");
  SetFlip(args, &o);
  o.random_resized_crop = args.Bool("random_resized_crop");
  o.crop_scale = Pair(args, "crop_scale");
  o.crop_ratio = Pair(args, "crop_ratio");
  o.erase_p = args.Float("erase");
  o.erase_scale = Pair(args, "erase_scale");
  o.erase_ratio = Pair(args, "erase_ratio");
  o.trivial_augment = args.Bool("trivial_augment");
  const std::vector<double> jitter = args.Floats("color_jitter");
  if (jitter.empty() || jitter.size() > 4) {
    throw ConfigError(
        StrCat("color_jitter: expected [brightness, contrast, saturation, hue] (1 "
               "to 4 values, the rest 0), got ",
               jitter.size(), " values"));
  }
  std::copy(jitter.begin(), jitter.end(), o.color_jitter.begin());
  train_options_ = o;
  eval_ = std::make_unique<Augmenter>(eval_options_);
  train_ = std::make_unique<Augmenter>(train_options_);
}

bool ImageSampleDecoder::FuseNormalize(const std::vector<double>& mean,
                                       const std::vector<double>& std) {
  if (mean.size() != std.size() || (mean.size() != 1 && mean.size() != size_t(channels_))) {
    return false;
  }
  // The transform's float values, so the table holds its results bitwise.
  const std::vector<float> m(mean.begin(), mean.end()), s(std.begin(), std.end());
  for (AugmentOptions* o : {&train_options_, &eval_options_}) {
    o->mean = m;
    o->std = s;
  }
  eval_ = std::make_unique<Augmenter>(eval_options_);
  train_ = std::make_unique<Augmenter>(train_options_);
  return true;
}

std::string ImageSampleDecoder::DecodeEncoded(const uint8_t* data, size_t size,
                                              const ReadContext& ctx, int64_t index,
                                              float* dst) const {
  thread_local std::vector<uint8_t> hwc;
  const ImageResult r = DecodeImage(data, size, channels_, &hwc, resize_min_side_);
  if (!r.ok()) return r.error;
  AugmentPixels(hwc.data(), r.height, r.width, ctx, index, dst);
  return "";
}

void ImageSampleDecoder::AugmentPixels(const uint8_t* hwc, int h, int w, const ReadContext& ctx,
                                       int64_t index, float* dst) const {
  if (ctx.decoded != nullptr) {
    ctx.decoded->hwc.assign(hwc, hwc + static_cast<size_t>(h) * w * channels_);
    ctx.decoded->h = h;
    ctx.decoded->w = w;
    ctx.decoded->c = channels_;
    return;
  }
  (ctx.train ? *train_ : *eval_).Run(hwc, h, w, channels_, ctx.seed, ctx.epoch, index, dst);
}

}  // namespace cnnflow
