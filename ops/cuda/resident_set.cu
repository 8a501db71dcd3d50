// The device-resident set's upload and its batch kernel (resident_set.h).
// One thread per output element: its sample, channel and pixel from the
// element index (NCHW or NHWC order), its source pixel by CropFlipSource,
// the value by NormalisePixel (IEEE division and subtraction: nvcc without
// --use_fast_math divides correctly rounded, and nothing here can fuse), so
// the f32 result is bitwise the CPU reference's.
#include <cuda_runtime.h>

#include "ops/crop_flip.h"
#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/resident_set.h"

namespace cnnflow {
namespace {

constexpr int kMaxChannels = 4;

struct Normalisation {
  float mean[kMaxChannels];
  float std[kMaxChannels];
};

template <typename T, bool kNhwc>
__global__ void CropFlipBatchKernel(const uint8_t* images, const CropFlipDraw* draws, int64_t n,
                                    CropFlipGeometry g, Normalisation norm, T* out) {
  const int64_t plane = int64_t{g.out_h} * g.out_w;
  const int64_t per = plane * g.channels;
  const int64_t total = n * per;
  const int64_t image_bytes = int64_t{g.h} * g.w * g.channels;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = i / per;
    const int64_t r = i - b * per;
    int c, y, x;
    if (kNhwc) {  // r = (y * out_w + x) * C + c
      c = static_cast<int>(r % g.channels);
      const int64_t p = r / g.channels;
      y = static_cast<int>(p / g.out_w);
      x = static_cast<int>(p - int64_t{y} * g.out_w);
    } else {  // r = (c * out_h + y) * out_w + x
      c = static_cast<int>(r / plane);
      const int64_t p = r - c * plane;
      y = static_cast<int>(p / g.out_w);
      x = static_cast<int>(p - int64_t{y} * g.out_w);
    }
    const CropFlipDraw d = draws[b];
    const int64_t s = CropFlipSource(g, d, y, x);
    const uint8_t v =
        s < 0 ? uint8_t{0} : images[d.image * image_bytes + int64_t{c} * g.h * g.w + s];
    out[i] = cuda::FromFloat<T>(NormalisePixel(v, norm.mean[c], norm.std[c]));
  }
}

template <typename T>
void Launch(bool nhwc, const uint8_t* images, const CropFlipDraw* draws, int64_t n,
            const CropFlipGeometry& g, const Normalisation& norm, void* out, cudaStream_t stream) {
  const int64_t total = n * g.channels * g.out_h * g.out_w;
  if (nhwc) {
    CropFlipBatchKernel<T, true><<<CudaBlocks(total), kCudaThreads, 0, stream>>>(
        images, draws, n, g, norm, static_cast<T*>(out));
  } else {
    CropFlipBatchKernel<T, false><<<CudaBlocks(total), kCudaThreads, 0, stream>>>(
        images, draws, n, g, norm, static_cast<T*>(out));
  }
  CNNFLOW_CUDA_CHECK_LAUNCH();
}

}  // namespace

ResidentImages::ResidentImages(Device device, const uint8_t* images, int64_t n, int c, int h, int w)
    : device_(device), n_(n), c_(c), h_(h), w_(w) {
  CNNFLOW_ENFORCE(device.is_cuda(), "a device-resident set lives on a GPU, not ",
                  device.ToString());
  CNNFLOW_ENFORCE(n > 0 && c >= 1 && c <= kMaxChannels && h > 0 && w > 0,
                  "a device-resident set holds [N, C, H, W] uint8 images with C in 1..4, got [", n,
                  ", ", c, ", ", h, ", ", w, "]");
  CudaContext::For(device);
  const AllocationScope scope([this] {
    return StrCat("the device-resident data set (", n_, " images of ", c_, "x", h_, "x", w_, ")");
  });
  images_ = std::make_shared<Storage>(device, bytes());
  CopyBytes(device, images_->data(), Device::Cpu(), images, bytes());
}

ResidentImages::~ResidentImages() {
  // The pool may hand the block out again at once: the batches issued on
  // the compute stream must be past it.
  try {
    CudaContext::Get(device_.index).Synchronize();
  } catch (...) {  // a failing GPU: the run is ending with its own error
  }
}

size_t ResidentImages::FreeBytes(Device device) {
  CudaContext::For(device);
  size_t free_bytes = 0, total = 0;
  CNNFLOW_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return free_bytes;
}

Tensor ResidentImages::MakeBatch(const CropFlipDraw* draws, int64_t n,
                                 const BatchFormat& format) const {
  const CropFlipGeometry& g = format.geometry;
  CNNFLOW_ENFORCE(g.channels == c_ && g.h == h_ && g.w == w_, "resident set: a batch of ",
                  g.channels, "x", g.h, "x", g.w, " source images from a set of ", c_, "x", h_, "x",
                  w_);
  CNNFLOW_ENFORCE(
      g.out_h > 0 && g.out_w > 0 && g.pad >= 0 && (!g.reflect || (g.pad < g.h && g.pad < g.w)),
      "resident set: bad sample geometry ", g.out_h, "x", g.out_w, " pad ", g.pad);
  CNNFLOW_ENFORCE(
      format.mean.size() == static_cast<size_t>(c_) && format.std.size() == static_cast<size_t>(c_),
      "resident set: mean and std need one value per channel (", c_, ")");
  CNNFLOW_ENFORCE(
      format.dtype == DType::kF32 || format.dtype == DType::kF16 || format.dtype == DType::kBF16,
      "resident set: batches are f32, f16 or bf16, not ", DTypeName(format.dtype));
  for (int64_t i = 0; i < n; ++i) {
    CNNFLOW_ENFORCE(draws[i].image >= 0 && draws[i].image < n_, "resident set: image ",
                    draws[i].image, " out of range [0, ", n_, ")");
  }
  Normalisation norm{};
  for (int c = 0; c < c_; ++c) {
    norm.mean[c] = format.mean[c];
    norm.std[c] = format.std[c];
  }
  CudaContext& ctx = CudaContext::For(device_);
  Tensor out = Tensor::Empty(Shape{n, c_, g.out_h, g.out_w}, format.dtype, device_);
  if (n == 0) return out;
  // The draws, on the compute stream: a pageable source is copied out
  // before cudaMemcpyAsync returns, and the block goes back to the pool
  // after the kernel that reads it is issued (the ordering rule).
  Storage device_draws(device_, static_cast<size_t>(n) * sizeof(CropFlipDraw));
  CNNFLOW_CUDA_CHECK(cudaMemcpyAsync(device_draws.data(), draws, device_draws.bytes(),
                                     cudaMemcpyHostToDevice, ctx.stream()));
  const auto* images = static_cast<const uint8_t*>(images_->data());
  const auto* d = static_cast<const CropFlipDraw*>(device_draws.data());
  switch (format.dtype) {
    case DType::kF32:
      Launch<float>(format.nhwc, images, d, n, g, norm, out.raw_data(), ctx.stream());
      break;
    case DType::kF16:
      Launch<__half>(format.nhwc, images, d, n, g, norm, out.raw_data(), ctx.stream());
      break;
    default:
      Launch<__nv_bfloat16>(format.nhwc, images, d, n, g, norm, out.raw_data(), ctx.stream());
  }
  return out;
}

}  // namespace cnnflow
