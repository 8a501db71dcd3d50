// torchvision's photometric and geometric image ops, computed as
// torchvision.transforms.functional computes them on tensors, for the
// loaders' ColorJitter and TrivialAugmentWide (loaders/augment.h):
//   - on [h, w, c] uint8 images (HwcU8) with its uint8 tensor arithmetic:
//     blends in float32, clamped to [0, 255] and truncated to uint8 (as
//     Tensor.to(torch.uint8)); affine maps sampled nearest-neighbour with
//     zeros outside the image;
//   - on [c, h, w] float planes of values in [0, 1] (ChwF) with its float
//     tensor arithmetic: float32, clamped to [0, 1], never rounded to 1/255.
// Compiled without fused multiply-adds (loaders/CMakeLists.txt), as
// torchvision rounds each product and sum. c is 1 or 3 (RGB). As
// torchvision, saturation and hue leave a 1-channel image unchanged, and
// grayscale is 0.2989 R + 0.587 G + 0.114 B (its rgb_to_grayscale on
// tensors; PIL's "L" uses 0.299), truncated to uint8 on uint8 images.
#pragma once

#include <array>
#include <cstdint>

namespace cnnflow {

struct HwcU8 {
  uint8_t* data;
  int h, w, c;
};
struct ChwF {
  float* data;
  int h, w, c;
};

// adjust_brightness: blend with black, v' = factor v.
void AdjustBrightness(HwcU8 img, double factor);
void AdjustBrightness(ChwF img, double factor);
// adjust_contrast: blend with the mean of the grayscale image (of the image
// itself when c == 1), v' = factor v + (1 - factor) mean.
void AdjustContrast(HwcU8 img, double factor);
void AdjustContrast(ChwF img, double factor);
// adjust_saturation: blend with the per-pixel grayscale.
void AdjustSaturation(HwcU8 img, double factor);
void AdjustSaturation(ChwF img, double factor);
// adjust_hue (float images only): RGB -> HSV, h' = (h + shift) mod 1, HSV ->
// RGB, with torchvision's _rgb2hsv / _hsv2rgb. |shift| <= 0.5.
void AdjustHue(ChwF img, double shift);
// adjust_sharpness: blend with the image smoothed by the 3x3 kernel [[1, 1,
// 1], [1, 5, 1], [1, 1, 1]] / 13 (rounded to uint8) inside a 1-pixel border
// that keeps the image's own values; images of side <= 2 are unchanged.
void AdjustSharpness(HwcU8 img, double factor);
// posterize: keep the high `bits` bits (1..8) of every value.
void Posterize(HwcU8 img, int bits);
// solarize: v >= threshold -> 255 - v.
void Solarize(HwcU8 img, double threshold);
// autocontrast: per channel, (v - min) * 255 / (max - min), truncated; a
// constant channel is unchanged.
void AutoContrast(HwcU8 img);
// equalize: per channel, PIL's / torchvision's histogram equalisation (the
// step is the count of all values but the largest present, / 255; a channel
// whose step is 0 is unchanged).
void Equalize(HwcU8 img);

// torchvision's _get_inverse_affine_matrix: the map [a, b, tx, c, d, ty]
// from an output pixel to its source, in coordinates centred on the image
// (x right, y down, origin at (w / 2, h / 2)): the inverse of T * C * R(angle)
// * Shear * C^-1 with C the translation to `center` (centred coordinates),
// angles in degrees (angle clockwise on screen, as torchvision's affine).
std::array<double, 6> InverseAffineMatrix(std::array<double, 2> center, double angle,
                                          std::array<double, 2> translate,
                                          std::array<double, 2> shear);
// F.affine / F.rotate on a tensor with NEAREST and fill 0: output pixel
// (row i, column j) takes the source pixel nearest (round half to even) to
// inverse (x, y) with (x, y) = (j + 0.5 - w / 2, i + 0.5 - h / 2), or 0
// outside the image; computed in float32 as torchvision's affine grid and
// grid_sample (align_corners=False). dst != src.
void AffineNearest(const HwcU8& src, const std::array<double, 6>& inverse, uint8_t* dst);

// TrivialAugmentWide's 14 ops, in torchvision's order (_augmentation_space).
enum class TrivialOp {
  kIdentity,
  kShearX,
  kShearY,
  kTranslateX,
  kTranslateY,
  kRotate,
  kBrightness,
  kColor,
  kContrast,
  kSharpness,
  kPosterize,
  kSolarize,
  kAutoContrast,
  kEqualize,
};
inline constexpr int kTrivialOps = 14;
inline constexpr int kTrivialBins = 31;  // num_magnitude_bins
const char* TrivialOpName(TrivialOp op);
// Whether the magnitude takes a random sign.
bool TrivialOpSigned(TrivialOp op);
// The magnitude of bin 0..30 (TrivialAugmentWide's wide space): shears and
// the enhance ops (brightness, color, contrast, sharpness) 0.99 bin / 30,
// translations 32 bin / 30 pixels, rotation 135 bin / 30 degrees, posterize
// 8 - round(bin / 5) bits, solarize 255 - 8.5 bin; 0 for the ops without
// one. Each as a float32 value, as torchvision's tables are float32 tensors,
// but rounded from the exact value: torch.linspace's float32 steps put bin
// 15 of the translations at 15.999999 on AVX2 (and 16.0 on AVX-512), which
// int() makes 15 pixels; here it is 16.
double TrivialMagnitude(TrivialOp op, int bin);
// torchvision's autoaugment._apply_op(img, op, magnitude, NEAREST, fill
// None) in place: shears about the top-left corner by atan(magnitude),
// translations by int(magnitude) pixels, rotation by magnitude degrees
// counter-clockwise about the centre, enhance ops with factor 1 +
// magnitude, posterize to int(magnitude) bits, solarize at magnitude.
void ApplyTrivialOp(TrivialOp op, double magnitude, HwcU8 img);

}  // namespace cnnflow
