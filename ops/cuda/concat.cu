// concat on a GPU (ops/layers/concat.h): each input is one 2D copy (N rows
// of its block, at the output's row pitch) on the compute stream, in any
// float type (no arithmetic).
#include <cuda_runtime.h>

#include <vector>

#include "ops/cuda/map.cuh"
#include "ops/layers/concat.h"

namespace cnnflow {
namespace {

using namespace cuda;  // the shared checks (ops/cuda/map.cuh)

class CudaConcatLayer : public ConcatLayer {
 public:
  using ConcatLayer::ConcatLayer;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y,
               const ForwardContext& /*ctx*/) override {
    CheckGpuFloat(y, StrCat("concat '", name(), "' output"));
    std::vector<Tensor*> parts;
    for (const Tensor* t : x) parts.push_back(const_cast<Tensor*>(t));
    Copy(parts, y, true);
  }

  void Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& /*y*/, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    CheckGpuFloat(dy, StrCat("concat '", name(), "' dy"));
    Copy(dx, const_cast<Tensor&>(dy), false);
  }

 private:
  // to_output: parts -> whole; else whole -> parts (null parts skipped).
  void Copy(const std::vector<Tensor*>& parts, Tensor& whole, bool to_output) {
    const int64_t n = whole.dim(0);
    const size_t es = DTypeSize(whole.dtype());
    CNNFLOW_ENFORCE(parts.size() == block_.size() && whole.numel() == n * out_block_, "concat ",
                    name(), ": ", parts.size(), " parts, ", whole.shape());
    CudaContext& c = CudaContext::For(whole.device());
    int64_t offset = 0;
    for (size_t k = 0; k < parts.size(); ++k) {
      Tensor* p = parts[k];
      if (p != nullptr && n > 0) {
        const std::string what = StrCat("concat '", name(), "' part ", k);
        CheckGpuFloat(*p, what);
        CheckSameGpu(*p, whole, what);
        CheckSameType(*p, whole, what);
        CNNFLOW_ENFORCE(p->numel() == n * block_[k], what, " ", p->shape());
        char* at = static_cast<char*>(whole.raw_data()) + offset * es;
        const size_t width = block_[k] * es, pitch = out_block_ * es;
        if (to_output) {
          CNNFLOW_CUDA_CHECK(cudaMemcpy2DAsync(at, pitch, p->raw_data(), width, width, n,
                                               cudaMemcpyDeviceToDevice, c.stream()));
        } else {
          CNNFLOW_CUDA_CHECK(cudaMemcpy2DAsync(p->raw_data(), width, at, pitch, width, n,
                                               cudaMemcpyDeviceToDevice, c.stream()));
        }
      }
      offset += block_[k];
    }
  }
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(concat, CudaConcatLayer);

}  // namespace cnnflow
