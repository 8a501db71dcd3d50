// drop_path on a GPU (ops/layers/drop_path.h): the per-sample decisions are
// drawn on the host by the CPU class (DrawRows: N draws, the same as the
// CPU's bit for bit) and travel in the kernel's parameters, up to kRows
// rows per launch; y = x * scale[row], in f32 or, under mixed precision,
// f16/bf16 (computed in f32, rounded once).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "ops/cuda/map.cuh"
#include "ops/layers/drop_path.h"

namespace cnnflow {
namespace {

using namespace cuda;  // the shared checks and dispatch (ops/cuda/map.cuh)

constexpr int kRows = 256;
struct RowScales {
  float scale[kRows];
};

// Block row blockIdx.y: y[row, :] = x[row, :] * scale[row].
template <typename T>
__global__ void ScaleRowsKernel(const T* x, T* y, int64_t per, RowScales s) {
  const int64_t o = static_cast<int64_t>(blockIdx.y) * per;
  const float m = s.scale[blockIdx.y];
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < per;
       j += stride) {
    y[o + j] = FromFloat<T>(ToFloat(x[o + j]) * m);
  }
}

class CudaDropPathLayer : public DropPathLayer {
 public:
  using DropPathLayer::DropPathLayer;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override {
    const Tensor& in = *x[0];
    Check(in, y, "input", "output");
    CudaContext& c = CudaContext::For(in.device());
    if (!DrawRows(in.dim(0), ctx)) {
      CopyAsync(in, y, c.stream());
      return;
    }
    ScaleRows(in, y, c.stream());
  }

  void Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    if (dx.empty() || dx[0] == nullptr) return;
    Check(dy, *dx[0], "dy", "dx");
    CudaContext& c = CudaContext::For(dy.device());
    if (row_scale_.empty()) {
      CopyAsync(dy, *dx[0], c.stream());
      return;
    }
    CNNFLOW_ENFORCE(dy.dim(0) == static_cast<int64_t>(row_scale_.size()), "drop_path ", name(),
                    ": dy ", dy.shape(), " but the last forward had ", row_scale_.size(), " rows");
    ScaleRows(dy, *dx[0], c.stream());
  }

 private:
  void Check(const Tensor& a, const Tensor& b, const char* an, const char* bn) const {
    CheckGpuFloat(a, StrCat("drop_path '", name(), "' ", an));
    CheckGpuFloat(b, StrCat("drop_path '", name(), "' ", bn));
    CheckSameGpu(a, b, StrCat("drop_path '", name(), "'"));
    CheckSameType(a, b, StrCat("drop_path '", name(), "'"));
    CNNFLOW_ENFORCE(a.numel() == b.numel(), "drop_path ", name(), ": ", a.shape(), " and ",
                    b.shape());
  }

  // dst = src * row_scale_ per row.
  void ScaleRows(const Tensor& src, Tensor& dst, cudaStream_t stream) const {
    const int64_t rows = src.dim(0), n = src.numel();
    if (n == 0) return;
    const int64_t per = n / rows;
    DispatchGpuFloat(src.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      const T* s = static_cast<const T*>(src.raw_data());
      T* d = static_cast<T*>(dst.raw_data());
      for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
        const int64_t count = std::min<int64_t>(kRows, rows - r0);
        RowScales scales;
        for (int64_t r = 0; r < count; ++r) {
          scales.scale[r] = static_cast<float>(row_scale_[r0 + r]);
        }
        const unsigned bx = static_cast<unsigned>(
            std::max<int64_t>(1, std::min<int64_t>(CudaBlocks(per), 4096 / count)));
        const dim3 grid(bx, static_cast<unsigned>(count));
        ScaleRowsKernel<T>
            <<<grid, kCudaThreads, 0, stream>>>(s + r0 * per, d + r0 * per, per, scales);
        CNNFLOW_CUDA_CHECK_LAUNCH();
      }
    });
  }
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(drop_path, CudaDropPathLayer);

}  // namespace cnnflow
