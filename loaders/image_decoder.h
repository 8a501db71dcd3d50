// Image decoding for the loaders and the converter: one entry point that
// decodes encoded image bytes (JPEG or PNG, told apart by their magic bytes)
// into HWC uint8 pixels. JPEG goes through TurboJPEG (jpeg_decoder.h, with
// its DCT-domain downscaling); PNG through libpng directly (never OpenCV's
// imgcodecs, which GPU builds must not link). Bad data is a value (an error
// message), never an exception, a longjmp out of the caller or an abort.
//
// Also ImageSampleDecoder: the decode + augment step that the image sources
// (`lmdb`, `folder`) share, so that both turn the same bytes into the same
// sample.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loaders/augment.h"
#include "loaders/dataset.h"
#include "ops/schema.h"
#include "ops/shape.h"

namespace cnnflow {

enum class ImageFormat { kUnknown, kJpeg, kPng };
const char* ImageFormatName(ImageFormat f);  // "unknown", "jpeg", "png"

// By the magic bytes: FF D8 FF (JPEG), 89 'PNG' 0D 0A 1A 0A (PNG).
ImageFormat DetectImageFormat(const uint8_t* data, size_t size);

// What a header read or a decode found. On failure `error` says why
// ("unknown image format ...", "corrupt PNG: ...", "truncated PNG: ...",
// "corrupt JPEG: ...", ...) and the sizes are unspecified.
struct ImageResult {
  ImageFormat format = ImageFormat::kUnknown;
  int width = 0;
  int height = 0;
  // ReadImageHeader: channels in the file (1 gray, 2 gray + alpha, 3 colour
  // or palette, 4 colour + alpha or CMYK). DecodeImage: channels written.
  int channels = 0;
  std::string error;
  bool ok() const { return error.empty(); }
};

// Limit on either side of an image: a corrupt header claiming 60000 x 60000
// fails instead of allocating (the same limit as the JPEG decoder's).
inline constexpr int kMaxImageSide = 1 << 15;

// Reads the header only (no pixel data is decoded).
ImageResult ReadImageHeader(const uint8_t* data, size_t size);

// The channel count a decode gives when none is asked for: 1 for gray files
// (with or without alpha), else 3.
int DefaultImageChannels(int file_channels);

// Decodes into *hwc (resized to fit) as HWC uint8 [height, width,
// out_channels], rows packed. out_channels: 1 or 3 (0: DefaultImageChannels).
// Colour to gray uses BT.601 luma (for PNG as OpenCV's RGB2GRAY:
// (4899 R + 9617 G + 1868 B + 8192) >> 14; for JPEG TurboJPEG's Y); gray to
// colour replicates; alpha (and PNG tRNS transparency) is dropped, not
// composited. PNG: 1/2/4/8/16-bit gray, RGB, palette, with or without alpha,
// interlaced or not; 16-bit samples keep their high byte (as OpenCV's
// imread). target_min_side > 0 (JPEG only) decodes downscaled in the DCT
// domain by the smallest factor whose min side stays >= target_min_side
// (JpegDecoder::PickScale); PNG is always decoded at full size. JPEG uses
// this thread's ThreadLocalJpegDecoder (strict: a warning is an error).
// Thread-safe.
ImageResult DecodeImage(const uint8_t* data, size_t size, int out_channels,
                        std::vector<uint8_t>* hwc, int target_min_side = 0);

// Converts `pixels` HWC uint8 pixels in place from `from` channels (1 gray,
// 2 gray + alpha, 3 RGB, 4 RGBA) to `to` (1 or 3), by DecodeImage's rules
// (luma, replication, alpha dropped). buf holds pixels * max(from, to)
// bytes.
void ConvertImageChannels(uint8_t* buf, size_t pixels, int from, int to);

// Adds the augmentation parameters every image source takes (pad,
// pad_mode, random_crop, hflip, resize_min_side, random_resized_crop,
// crop_scale, crop_ratio, erase, erase_scale, erase_ratio, trivial_augment,
// color_jitter) to a source's schema. hflip
// is a choice of "false", "true" (YAML's bools) or "alternate"; code may also
// set it as a bool.
Schema AddImageAugmentParams(Schema schema);

// Decode + augment for an image source: [C, H, W] samples from encoded
// bytes or HWC pixels, augmented (per seed, epoch, sample) in training
// passes, centre-cropped in evaluation passes. Const and thread-safe.
class ImageSampleDecoder {
 public:
  // shape: the sample shape [C, H, W] (C 1 or 3); args: the parameters of
  // AddImageAugmentParams. Throws ConfigError for bad values.
  ImageSampleDecoder(const Shape& shape, const Args& args);

  // JPEG / PNG bytes -> dst ([C, H, W] floats in [0, 1], before
  // normalisation). Returns the decoder's error ("" when ok).
  std::string DecodeEncoded(const uint8_t* data, size_t size, const ReadContext& ctx, int64_t index,
                            float* dst) const;
  // HWC uint8 [h, w, C] -> dst; with ctx.decoded, the pixels go there
  // instead (dst is not written).
  void AugmentPixels(const uint8_t* hwc, int h, int w, const ReadContext& ctx, int64_t index,
                     float* dst) const;

  int channels() const { return channels_; }
  const AugmentOptions& train_options() const { return train_options_; }
  // Dataset::FuseNormalize for the image sources: the augmenters write
  // (v / 255 - mean) / std. False (nothing changed) when mean/std do not fit
  // the channels, so the transform reports it.
  bool FuseNormalize(const std::vector<double>& mean, const std::vector<double>& std);
  // Whether one did (the augmenters normalise only then).
  bool normalizes() const { return !train_options_.mean.empty(); }

 private:
  int channels_ = 0;
  int resize_min_side_ = 0;
  AugmentOptions train_options_, eval_options_;
  std::unique_ptr<Augmenter> train_, eval_;
};

}  // namespace cnnflow
