// cuDNN kernels of the pooling layers (the CUDA classes of ops/layers/pooling.h
// and ops/layers/pooling1d.h): maxpool2d, avgpool2d, global_avgpool, maxpool1d,
// avgpool1d, with the CPU layers' semantics:
//  - output size by the floor rule, as cuDNN's (checked per shape);
//  - max: padded cells never win (cuDNN pools only real cells), a NaN wins
//    (CUDNN_PROPAGATE_NAN); CUDNN_POOLING_MAX_DETERMINISTIC routes each
//    output's gradient to one cell, so overlapping windows sum in a fixed
//    order, as the CPU's argmax scatter;
//  - avg: count_include_pad maps to CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
//    (with pad <= kernel / 2 and the floor rule no window passes the padded
//    border, so both divide by kh * kw) or ..._EXCLUDE_PADDING;
//  - global_avgpool: an average pool whose window is the whole plane;
//  - 1D layers: [N, C, L] is [N, C, 1, L] with a 1 x k window.
// A ceil_mode size that rounded up (a last window hangs over the padded
// input) is what cuDNN cannot pool: those layers run ops/cuda/pooling_ceil.h.
// Tensors are f32, or f16/bf16 under mixed precision (cuDNN pools half
// data as it is: a max is exact, an average is summed in f32 and rounded
// once). Descriptors are made once and re-set only when the shape or dtype
// changes. One class template serves the five layer types (PoolCudnn).
// Channels-last (Layer::SetChannelsLast): maxpool2d and avgpool2d pool NHWC
// tensors on NHWC descriptors (not a ceil_mode size that rounded up: those
// kernels are NCHW only); global_avgpool reads either layout (its output
// [N, C, 1, 1] is the same memory in both).
#include <cudnn.h>

#include <string>
#include <type_traits>
#include <vector>

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cudnn_util.h"
#include "ops/cuda/pooling_ceil.h"
#include "ops/layers/pooling.h"
#include "ops/layers/pooling1d.h"

namespace cnnflow {
namespace {

using detail::kCudnnOne;
using detail::kCudnnZero;

int ToInt(int64_t v, const std::string& layer) { return detail::CudnnInt(v, layer, "dimension"); }

// A pooling window and the shapes it maps: x [n, c, h, w] -> y [n, c, out_h, out_w].
struct PoolSpec {
  cudnnPoolingMode_t mode = CUDNN_POOLING_MAX;
  int64_t kernel_h = 1, kernel_w = 1, pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1;
  int64_t n = 0, c = 0, h = 0, w = 0, out_h = 0, out_w = 0;
  DType dtype = DType::kF32;
  bool nhwc = false;  // x and y stored [n, h, w, c]

  bool SameWindow(const PoolSpec& o) const {
    return mode == o.mode && kernel_h == o.kernel_h && kernel_w == o.kernel_w && pad_h == o.pad_h &&
           pad_w == o.pad_w && stride_h == o.stride_h && stride_w == o.stride_w;
  }
  bool SameShape(const PoolSpec& o) const {
    return n == o.n && c == o.c && h == o.h && w == o.w && out_h == o.out_h && out_w == o.out_w &&
           dtype == o.dtype && nhwc == o.nhwc;
  }
};

// The cuDNN state of one pooling layer.
class CudnnPool {
 public:
  CudnnPool() = default;
  ~CudnnPool() {
    if (x_desc_) cudnnDestroyTensorDescriptor(x_desc_);
    if (y_desc_) cudnnDestroyTensorDescriptor(y_desc_);
    if (pool_desc_) cudnnDestroyPoolingDescriptor(pool_desc_);
  }
  CudnnPool(const CudnnPool&) = delete;
  CudnnPool& operator=(const CudnnPool&) = delete;

  // y (overwritten) = pool(x); x and y hold spec's shapes.
  void Forward(const std::string& layer, const PoolSpec& spec, const Tensor& x, Tensor& y) {
    CudaContext& ctx = CudaContext::For(x.device());
    Prepare(layer, spec, x, y, "output");
    CNNFLOW_CUDNN_CHECK(cudnnPoolingForward(ctx.cudnn(), pool_desc_, &kCudnnOne, x_desc_,
                                            x.raw_data(), &kCudnnZero, y_desc_, y.raw_data()));
  }

  // dx (overwritten) from dy, with the forward's x and y (max pooling finds
  // each window's winner from them).
  void Backward(const std::string& layer, const PoolSpec& spec, const Tensor& x, const Tensor& y,
                const Tensor& dy, Tensor& dx) {
    CudaContext& ctx = CudaContext::For(x.device());
    Prepare(layer, spec, x, y, "output");
    Check(layer, dy, spec.n * spec.c * spec.out_h * spec.out_w, spec.dtype, "output gradient");
    Check(layer, dx, x.numel(), spec.dtype, "input gradient");
    CNNFLOW_CUDNN_CHECK(cudnnPoolingBackward(ctx.cudnn(), pool_desc_, &kCudnnOne, y_desc_,
                                             y.raw_data(), y_desc_, dy.raw_data(), x_desc_,
                                             x.raw_data(), &kCudnnZero, x_desc_, dx.raw_data()));
  }

 private:
  static void Check(const std::string& layer, const Tensor& t, int64_t numel, DType dtype,
                    const char* what) {
    CNNFLOW_ENFORCE(
        t.is_contiguous() && t.numel() == numel && t.dtype() == dtype && t.device().is_cuda(),
        layer, ": ", what, " ", t.shape(), " (", DTypeName(t.dtype()), " on ",
        t.device().ToString(), ") does not fit: expected ", numel, " contiguous ", DTypeName(dtype),
        " values on a GPU");
  }

  void Prepare(const std::string& layer, const PoolSpec& spec, const Tensor& x, const Tensor& y,
               const char* y_what) {
    Check(layer, x, spec.n * spec.c * spec.h * spec.w, spec.dtype, "input");
    Check(layer, y, spec.n * spec.c * spec.out_h * spec.out_w, spec.dtype, y_what);
    if (pool_desc_ == nullptr) {
      CNNFLOW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_desc_));
      CNNFLOW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_desc_));
      CNNFLOW_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&pool_desc_));
    }
    bool changed = false;
    if (!window_set_ || !spec.SameWindow(spec_)) {
      CNNFLOW_CUDNN_CHECK(cudnnSetPooling2dDescriptor(
          pool_desc_, spec.mode, CUDNN_PROPAGATE_NAN, ToInt(spec.kernel_h, layer),
          ToInt(spec.kernel_w, layer), ToInt(spec.pad_h, layer), ToInt(spec.pad_w, layer),
          ToInt(spec.stride_h, layer), ToInt(spec.stride_w, layer)));
      window_set_ = true;
      changed = true;
    }
    if (!shape_set_ || !spec.SameShape(spec_)) {
      const cudnnDataType_t type = detail::CudnnDataTypeOf(spec.dtype, layer);
      const cudnnTensorFormat_t format = spec.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
      CNNFLOW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_desc_, format, type, ToInt(spec.n, layer),
                                                     ToInt(spec.c, layer), ToInt(spec.h, layer),
                                                     ToInt(spec.w, layer)));
      CNNFLOW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y_desc_, format, type, ToInt(spec.n, layer),
                                                     ToInt(spec.c, layer), ToInt(spec.out_h, layer),
                                                     ToInt(spec.out_w, layer)));
      shape_set_ = true;
      changed = true;
    }
    if (changed) {
      // cuDNN's output size rule must be the layer's.
      int n = 0, c = 0, h = 0, w = 0;
      CNNFLOW_CUDNN_CHECK(cudnnGetPooling2dForwardOutputDim(pool_desc_, x_desc_, &n, &c, &h, &w));
      if (n != spec.n || c != spec.c || h != spec.out_h || w != spec.out_w) {
        throw Error(StrCat(layer, ": cuDNN pools [", spec.n, ", ", spec.c, ", ", spec.h, ", ",
                           spec.w, "] (window ", spec.kernel_h, "x", spec.kernel_w, ", stride ",
                           spec.stride_h, "x", spec.stride_w, ", pad ", spec.pad_h, "x", spec.pad_w,
                           ") to [", n, ", ", c, ", ", h, ", ", w, "], the layer to [", spec.n,
                           ", ", spec.c, ", ", spec.out_h, ", ", spec.out_w, "]"));
      }
      spec_ = spec;
    }
  }

  cudnnTensorDescriptor_t x_desc_ = nullptr, y_desc_ = nullptr;
  cudnnPoolingDescriptor_t pool_desc_ = nullptr;
  bool window_set_ = false, shape_set_ = false;
  PoolSpec spec_;
};

PoolSpec Spec2d(cudnnPoolingMode_t mode, const Pool2dGeometry& g, const Tensor& x, bool nhwc) {
  PoolSpec s;
  s.nhwc = nhwc;
  s.mode = mode;
  s.kernel_h = g.kernel_h;
  s.kernel_w = g.kernel_w;
  s.pad_h = g.pad_h;
  s.pad_w = g.pad_w;
  s.stride_h = g.stride_h;
  s.stride_w = g.stride_w;
  s.n = x.dim(0);
  s.c = g.channels;
  s.h = g.in_h;
  s.w = g.in_w;
  s.out_h = g.out_h;
  s.out_w = g.out_w;
  s.dtype = x.dtype();
  return s;
}

PoolSpec Spec1d(cudnnPoolingMode_t mode, const Pool1dGeometry& g, const Tensor& x) {
  PoolSpec s;
  s.mode = mode;
  s.kernel_w = g.kernel;
  s.pad_w = g.pad;
  s.stride_w = g.stride;
  s.n = x.dim(0);
  s.c = g.channels;
  s.h = 1;
  s.w = g.in_len;
  s.out_h = 1;
  s.out_w = g.out_len;
  s.dtype = x.dtype();
  return s;
}

cudnnPoolingMode_t AvgMode(bool count_include_pad) {
  return count_include_pad ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                           : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
}

// One input, as every pooling layer takes.
const Tensor& OneInput(const std::vector<const Tensor*>& x, const std::string& layer) {
  CNNFLOW_ENFORCE(x.size() == 1 && x[0] != nullptr, layer, " takes one input");
  return *x[0];
}

// Spec makers: the window and shapes of each layer type for input x.
PoolSpec MaxPool2dSpec(const MaxPool2d& l, const Tensor& x) {
  return Spec2d(CUDNN_POOLING_MAX_DETERMINISTIC, l.geometry(), x, l.nhwc_input());
}
PoolSpec AvgPool2dSpec(const AvgPool2d& l, const Tensor& x) {
  return Spec2d(AvgMode(l.count_include_pad()), l.geometry(), x, l.nhwc_input());
}
PoolSpec MaxPool1dSpec(const MaxPool1d& l, const Tensor& x) {
  return Spec1d(CUDNN_POOLING_MAX_DETERMINISTIC, l.geometry(), x);
}
PoolSpec AvgPool1dSpec(const AvgPool1d& l, const Tensor& x) {
  return Spec1d(AvgMode(l.count_include_pad()), l.geometry(), x);
}
// The mean of each plane: an average pool whose window is the plane,
// [N, C, H, W] or [N, C, L] (as [N, C, 1, L]) -> [N, C] (as [N, C, 1, 1]).
PoolSpec GlobalAvgPoolSpec(const GlobalAvgPool& l, const Tensor& x) {
  CNNFLOW_ENFORCE(x.rank() == 3 || x.rank() == 4, l.type(), " '", l.name(),
                  "' expects [N, C, H, W] or [N, C, L] input, got ", x.shape());
  PoolSpec s;
  s.mode = CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
  s.n = x.dim(0);
  s.c = x.dim(1);
  s.h = x.rank() == 4 ? x.dim(2) : 1;
  s.w = x.dim(x.rank() - 1);
  s.kernel_h = s.stride_h = s.h;
  s.kernel_w = s.stride_w = s.w;
  s.out_h = s.out_w = 1;
  s.dtype = x.dtype();
  s.nhwc = l.nhwc_input() && x.rank() == 4;
  return s;
}

// A pooling layer on cuDNN: the CPU class `Base` (parameters, Build, shape
// rule) with Forward and Backward on cuDNN; MakeSpec gives the window.
template <typename Base, PoolSpec (*MakeSpec)(const Base&, const Tensor&)>
class PoolCudnn : public Base {
 public:
  using Base::Base;

  Layer::ChannelsLast ChannelsLastSupport() const override {
    if constexpr (std::is_same_v<Base, GlobalAvgPool>) {
      return Layer::ChannelsLast::kConverts;  // [N, C, 1, 1] out: either layout
    } else if constexpr (std::is_base_of_v<Pool2dBase, Base>) {
      return HangsOver() ? Layer::ChannelsLast::kNo : Layer::ChannelsLast::kFollows;
    } else {
      return Layer::ChannelsLast::kNo;
    }
  }

  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext&) override {
    const Tensor& in = OneInput(x, Label());
    if (HangsOver()) return CeilForward(in, y);
    pool_.Forward(Label(), MakeSpec(*this, in), in, y);
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    if (dx.empty() || dx[0] == nullptr) return;  // no parameters: nothing else to do
    if (HangsOver()) return CeilBackward(dy, *dx[0]);
    const Tensor& in = OneInput(x, Label());
    pool_.Backward(Label(), MakeSpec(*this, in), in, y, dy, *dx[0]);
  }

 private:
  // A 2D pooling whose ceil_mode size rounded up: not cuDNN's.
  bool HangsOver() const {
    if constexpr (std::is_base_of_v<Pool2dBase, Base>) {
      return !this->geometry().WindowsInside();
    } else {
      return false;
    }
  }
  void CeilForward(const Tensor& in, Tensor& y) {
    if constexpr (std::is_same_v<Base, MaxPool2d>) {
      cuda::CeilMaxPoolForward(this->geometry(), in, y, argmax_);
    } else if constexpr (std::is_same_v<Base, AvgPool2d>) {
      cuda::CeilAvgPoolForward(this->geometry(), this->count_include_pad(), in, y);
    }
  }
  void CeilBackward(const Tensor& dy, Tensor& dx) {
    if constexpr (std::is_same_v<Base, MaxPool2d>) {
      cuda::CeilMaxPoolBackward(this->geometry(), dy, argmax_, dx);
    } else if constexpr (std::is_same_v<Base, AvgPool2d>) {
      cuda::CeilAvgPoolBackward(this->geometry(), this->count_include_pad(), dy, dx);
    }
  }
  Tensor argmax_;  // ceil_mode max pooling: each output's winner, in its input plane
  const std::string& Label() const { return label_.Of(*this); }
  detail::LayerLabel label_;
  CudnnPool pool_;
};

using MaxPool2dCudnn = PoolCudnn<MaxPool2d, MaxPool2dSpec>;
using AvgPool2dCudnn = PoolCudnn<AvgPool2d, AvgPool2dSpec>;
using GlobalAvgPoolCudnn = PoolCudnn<GlobalAvgPool, GlobalAvgPoolSpec>;
using MaxPool1dCudnn = PoolCudnn<MaxPool1d, MaxPool1dSpec>;
using AvgPool1dCudnn = PoolCudnn<AvgPool1d, AvgPool1dSpec>;

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(maxpool2d, MaxPool2dCudnn);
CNNFLOW_REGISTER_CUDA_LAYER(avgpool2d, AvgPool2dCudnn);
CNNFLOW_REGISTER_CUDA_LAYER(global_avgpool, GlobalAvgPoolCudnn);
CNNFLOW_REGISTER_CUDA_LAYER(maxpool1d, MaxPool1dCudnn);
CNNFLOW_REGISTER_CUDA_LAYER(avgpool1d, AvgPool1dCudnn);

}  // namespace cnnflow
