// A device-resident data set: every image of a set that fits in GPU memory
// held on the GPU as uint8 [N, C, H, W] (uploaded once), and each batch
// made there from its sample draws: gathered, cropped, padded (zero or
// reflect), flipped and normalised by ops/crop_flip.h's arithmetic (the
// CPU loader's, bit for bit in f32), written in f32 or, for mixed
// precision, f16 / bf16 (rounded to nearest even from the f32 value), NCHW
// or channels-last NHWC. What airbench does with its CIFAR-10 tensor.
//
// The per-batch traffic is the draws (16 bytes a sample) instead of the
// pixels (12 KB a CIFAR sample in f32) through pinned memory.
//
// Plain C++, so code built without CUDA includes it: ops/cuda/resident_set.cu
// implements it, ops/cuda/device_stub.cc in a build without CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ops/crop_flip.h"
#include "ops/device.h"
#include "ops/dtype.h"
#include "ops/tensor.h"

namespace cnnflow {

class ResidentImages {
 public:
  // Uploads `images` (host, uint8 [n, c, h, w], c in 1..4) to GPU `device`.
  ResidentImages(Device device, const uint8_t* images, int64_t n, int c, int h, int w);
  ~ResidentImages();
  ResidentImages(const ResidentImages&) = delete;
  ResidentImages& operator=(const ResidentImages&) = delete;

  // How a batch is written: its sample geometry (channels, h and w must be
  // the set's), the normalisation (one mean and std per channel), the
  // element type (f32, f16 or bf16) and the layout.
  struct BatchFormat {
    CropFlipGeometry geometry;
    std::vector<float> mean, std;
    DType dtype = DType::kF32;
    bool nhwc = false;  // [n, out_h, out_w, C] in memory, else [n, C, out_h, out_w]
  };

  // The batch of `n` draws (host memory; each names an image of the set) as
  // a tensor on the GPU of shape [n, C, out_h, out_w] (NHWC: the same shape,
  // its memory [n, out_h, out_w, C]), issued on the device's compute
  // stream; returns without waiting for it. The draws are copied to the
  // device on that stream before the call returns, so `draws` may go.
  Tensor MakeBatch(const CropFlipDraw* draws, int64_t n, const BatchFormat& format) const;

  Device device() const { return device_; }
  int64_t size() const { return n_; }
  int channels() const { return c_; }
  int height() const { return h_; }
  int width() const { return w_; }
  size_t bytes() const { return static_cast<size_t>(n_) * c_ * h_ * w_; }

  // Free memory on GPU `device` now (cudaMemGetInfo), for the fit check.
  static size_t FreeBytes(Device device);

 private:
  Device device_;
  int64_t n_ = 0;
  int c_ = 0, h_ = 0, w_ = 0;
  std::shared_ptr<Storage> images_;
};

}  // namespace cnnflow
