// Per-sample image augmentation for the loaders: HWC uint8 (as decoded) ->
// CHW float, with resize, zero or reflect padding, random or centre crop,
// random (or alternating) horizontal flip, TrivialAugmentWide, ColorJitter,
// per-channel mean/std normalisation and random erasing, as torchvision's
// Resize / RandomCrop(padding, padding_mode) / CenterCrop /
// RandomHorizontalFlip / TrivialAugmentWide / ToTensor / ColorJitter /
// Normalize / RandomErasing chain (the alternating flip is airbench's).
//
// Reproducible whatever the thread count: every random choice is a pure
// function of (seed, epoch, sample_index) through ops/random.h, never of a
// shared generator or of the thread that runs it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "loaders/image_ops.h"
#include "ops/crop_flip.h"

namespace cnnflow {

// How padding is filled: zeros, or the image mirrored about its edge pixel
// without repeating it (numpy.pad / torch.nn.functional.pad mode 'reflect':
// row -1 is row 1, row h is row h - 2).
enum class PadMode { kZero, kReflect };

struct AugmentOptions {
  int out_h = 0;  // sample size written to chw_out: [C, out_h, out_w]
  int out_w = 0;
  // > 0: first resize (cv::resize, INTER_LINEAR) so min(h, w) == this; the
  // long side becomes floor(long * resize_min_side / short), as torchvision.
  int resize_min_side = 0;
  // Padding on every side before cropping (CIFAR's RandomCrop(32,
  // padding=4)). kZero: padded pixels are 0 before normalisation; kReflect:
  // mirrored (needs pad < both sides of the (resized) image: ConfigError).
  int pad = 0;
  PadMode pad_mode = PadMode::kZero;
  // Uniform random crop offset; else the centre crop (offset
  // round-half-even((size - out) / 2), as torchvision's CenterCrop). A crop
  // larger than the (padded) image is centred and zero-filled beyond the
  // padding, whatever pad_mode.
  bool random_crop = false;
  bool hflip = false;  // flip the crop left-right with p = 0.5
  // With hflip, airbench's alternating flip: a sample's flip in epoch 0 is
  // drawn from (seed, sample_index) alone, and in epoch e it is that draw
  // XOR (e odd), so each image is seen flipped in exactly one of any two
  // consecutive epochs.
  bool alternate_flip = false;
  // torchvision's RandomResizedCrop in place of the crop above (pad and
  // random_crop must be off): a region of area fraction ~U(crop_scale) and
  // aspect ratio (w / h) log-uniform in crop_ratio, at a uniform position,
  // of the (resized) image, resized to out_h x out_w (cv::resize,
  // INTER_LINEAR); 10 tries for one that fits, else the centre crop clamped
  // to crop_ratio.
  bool random_resized_crop = false;
  std::array<double, 2> crop_scale{0.08, 1.0};
  std::array<double, 2> crop_ratio{3.0 / 4.0, 4.0 / 3.0};
  // torchvision's TrivialAugmentWide() (31 magnitude bins, NEAREST, fill 0)
  // on the uint8 crop, after the flip: one of its 14 ops (loaders/image_ops.h)
  // drawn uniformly, a magnitude bin drawn uniformly, and for the signed ops
  // the sign with p = 0.5; as torchvision on a uint8 tensor. Needs 1 or 3
  // channels.
  bool trivial_augment = false;
  // torchvision's ColorJitter(brightness, contrast, saturation, hue), after
  // TrivialAugmentWide, on the float values v / 255 (as ColorJitter after
  // ToTensor: float32, clamped to [0, 1] after each op, never rounded to
  // uint8): factors b ~ U[max(0, 1 - x), 1 + x] for brightness, contrast
  // and saturation, a hue shift ~ U[-x, x] (x <= 0.5), applied in a random
  // order; 0 turns an op off. Needs 1 or 3 channels (saturation and hue
  // leave one channel unchanged).
  std::array<double, 4> color_jitter{0, 0, 0, 0};
  // Per channel on [0, 1] values: out = (v / 255 - mean[c]) / std[c]. Empty
  // = mean 0 / std 1; one value applies to every channel.
  std::vector<float> mean, std;
  // RandomErasing (torchvision's, placed after Normalize): with probability
  // erase_p, a rectangle of the output of area fraction ~U(erase_scale) and
  // aspect ratio (h / w) log-uniform in erase_ratio, at a uniform position,
  // is set to 0 in every channel; up to 10 tries for one that fits (h <
  // out_h and w < out_w), else nothing is erased. 0 after the normalisation
  // above (the image sources fuse the config's normalize transform into it).
  double erase_p = 0;  // 0: off
  std::array<double, 2> erase_scale{0.02, 0.33};
  std::array<double, 2> erase_ratio{0.3, 3.3};
};

// The random choices for one sample, in the coordinates of the padded
// (resized) image: the crop is rows [top, top + out_h), columns [left,
// left + out_w), then mirrored if flip.
struct AugmentParams {
  int top = 0;
  int left = 0;
  bool flip = false;
  // > 0: a random resized crop: rows [top, top + crop_h), columns [left,
  // left + crop_w) of the (resized, unpadded) image, resized to the output.
  int crop_h = 0;
  int crop_w = 0;
  // The erased rectangle of the output: rows [erase_top, erase_top +
  // erase_h), columns [erase_left, erase_left + erase_w); none when erase_h
  // or erase_w is 0.
  int erase_top = 0;
  int erase_left = 0;
  int erase_h = 0;
  int erase_w = 0;
  // TrivialAugmentWide's op and its signed magnitude (as torchvision's
  // _apply_op takes it); kIdentity: nothing.
  TrivialOp trivial_op = TrivialOp::kIdentity;
  double trivial_magnitude = 0;
  // ColorJitter: the ops in the order applied (0 brightness, 1 contrast, 2
  // saturation, 3 hue) and their factors (brightness, contrast, saturation,
  // hue shift); an op whose color_jitter option is 0 is skipped.
  std::array<int, 4> jitter_order{0, 1, 2, 3};
  std::array<double, 4> jitter{1, 1, 1, 0};
};

// Distinguishes the augmentation stream from others keyed by the same
// (seed, epoch, index), e.g. the sampler's.
inline constexpr uint64_t kAugmentStream = 0x6175676d656e74ULL;  // "augment"

// Size after the optional resize: {h, w}.
struct ImageSize {
  int h = 0;
  int w = 0;
};
ImageSize ResizedSize(int h, int w, int resize_min_side);

// The crop / flip drawn for (seed, epoch, sample_index) on an image of h x w
// (after resize, before padding). Stream: StreamKey(seed, epoch,
// sample_index, kAugmentStream); counters 0 (top), 1 (left), 2 (flip), 3
// (whether to erase), 4 + 4 k .. 7 + 4 k (erase try k: area, log ratio,
// top, left), 100 + 4 k .. 103 + 4 k (random resized crop try k: the same),
// 200 (TrivialAugmentWide's op), 201 (its magnitude bin), 202 (its sign:
// negative when >= 0.5), 210..213 (ColorJitter's brightness, contrast,
// saturation and hue) and 214..216 (its order: a Fisher-Yates shuffle of
// [0, 1, 2, 3], counter 214 + k picking position 3 - k's op among the
// first 4 - k). An alternating flip draws counter 2 of the epoch-0 stream,
// StreamKey(seed, 0, sample_index, kAugmentStream), so epoch 0 flips as the
// random flip does.
AugmentParams DrawAugmentParams(int h, int w, const AugmentOptions& options, uint64_t seed,
                                int64_t epoch, int64_t sample_index);

// The device-resident data set's view of these options (ops/crop_flip.h):
// the GPU applies pad, pad_mode, random_crop, hflip (true or alternate) and
// the normalisation, with the CPU loader's own draws. Returns "" when that
// covers `options`, else the first key it does not ("resize_min_side",
// "random_resized_crop", "erase", "trivial_augment", "color_jitter").
std::string CropFlipUnsupported(const AugmentOptions& options);
// The geometry of [c, h, w] source images under `options` (reflect only
// where pad > 0, as the loader).
CropFlipGeometry CropFlipGeometryOf(const AugmentOptions& options, int c, int h, int w);
// Sample sample_index's draw for epoch `epoch`: DrawAugmentParams itself (the
// loader's draw), as the GPU takes it; `image` is its row in the resident set.
CropFlipDraw DrawCropFlip(const AugmentOptions& options, int h, int w, uint64_t seed, int64_t epoch,
                          int64_t sample_index, int32_t image);
// The normalisation's per-channel mean and std for c channels (empty: 0 and
// 1; one value: every channel), as the loader's table takes them.
void CropFlipNormalisation(const AugmentOptions& options, int c, std::vector<float>* mean,
                           std::vector<float>* std);

// Options checked once, normalisation tables built once: use one per loader
// stage. Run() is const and thread-safe.
class Augmenter {
 public:
  // Throws cnnflow::ConfigError on bad options (sizes, std == 0, ...).
  explicit Augmenter(AugmentOptions options);
  const AugmentOptions& options() const { return options_; }

  // hwc: [h, w, c] uint8, c in 1..4 -> chw_out: [c, out_h, out_w] float.
  // Throws cnnflow::Error if c does not match mean/std (or is not 1 or 3
  // with trivial_augment or color_jitter), ConfigError if the (resized)
  // image is too small for reflect padding.
  void Run(const uint8_t* hwc, int h, int w, int c, uint64_t seed, int64_t epoch,
           int64_t sample_index, float* chw_out) const;
  // The same with the random choices given (tests, replay).
  void RunWithParams(const uint8_t* hwc, int h, int w, int c, const AugmentParams& params,
                     float* chw_out) const;

 private:
  static constexpr int kMaxChannels = 4;
  // [c, out_h, out_w] normalised (the table) from a crop at (p.top, p.left)
  // of `from` [size.h, size.w, c] with pad, flipped where p.flip.
  void GatherNormalised(const uint8_t* from, ImageSize size, int c, int pad, bool reflect,
                        const AugmentParams& p, float* chw_out) const;
  // ColorJitter on crop [out_h, out_w, c] / 255 in the drawn order, then the
  // normalisation, into chw_out [c, out_h, out_w].
  void JitterAndNormalise(const uint8_t* crop, int c, const AugmentParams& params,
                          float* chw_out) const;

  AugmentOptions options_;
  int norm_channels_ = 1;  // how many distinct mean/std entries (1 or c)
  // lut_[c * 256 + v] = (v / 255 - mean[c]) / std[c], computed in float;
  // the vector path computes the same from mean_ and std_ (per channel).
  std::vector<float> lut_;
  std::array<float, kMaxChannels> mean_{}, std_{};
};

// cv::setNumThreads(1), once per process (see the .cc for why). Every
// Augmenter calls it; so does anything else that resizes with OpenCV.
void UseSerialOpenCv();

// One-shot form of Augmenter(options).Run(...): builds the tables per call.
void Augment(const uint8_t* hwc, int h, int w, int c, const AugmentOptions& options, uint64_t seed,
             int64_t epoch, int64_t sample_index, float* chw_out);

}  // namespace cnnflow
