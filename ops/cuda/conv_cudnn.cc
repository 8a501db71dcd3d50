// cuDNN kernels of conv2d and conv1d (the CUDA classes of ops/conv2d.h and
// ops/conv1d.h), on the legacy cuDNN API.
//
// conv1d is conv2d on [N, C, 1, L] with a 1 x k kernel (Conv1d's geometry
// already is that 2D geometry), so both share CudnnConv below.
//
// Per layer: descriptors are made once and re-set only when the batch size
// changes; the algorithms of each batch size are chosen once by cuDNN's
// search (cudnnFind*AlgorithmEx on the real buffers, which blocks the host:
// once per batch size) and cached; the workspace comes from
// CudaContext::Workspace. Steady-state calls only issue work on the
// device's compute stream: no allocation, no host synchronisation.
//
// Precision: f32 convolutions run with CUDNN_DEFAULT_MATH, which lets cuDNN
// use TF32 tensor cores on Ampere and later (PyTorch's default,
// torch.backends.cudnn.allow_tf32 = True); algorithms that would convert
// f32 data down to f16 are never chosen. f16/bf16 tensors (mixed precision)
// search with CUDNN_TENSOR_OP_MATH and accumulate in f32.
#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "ops/conv1d.h"
#include "ops/conv2d.h"
#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"

namespace cnnflow {

namespace detail {

// The index of the algorithm to use among cuDNN's search results (sorted
// fastest first): the first that succeeded, fits in `workspace_limit`
// bytes and, when `allow_down_conversion` is false, is not
// CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION. -1 when none qualifies. Plain
// ints so a test can call it without cuDNN's headers.
int PickCudnnAlgo(const int* status, const int* math_type, const size_t* memory, int count,
                  size_t workspace_limit, bool allow_down_conversion) {
  for (int i = 0; i < count; ++i) {
    if (status[i] != static_cast<int>(CUDNN_STATUS_SUCCESS)) continue;
    if (memory[i] > workspace_limit) continue;
    if (!allow_down_conversion &&
        math_type[i] == static_cast<int>(CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)) {
      continue;
    }
    return i;
  }
  return -1;
}

}  // namespace detail

namespace {

// The most workspace an algorithm search may use: fast algorithms (FFT,
// Winograd) ask for a lot, but the block stays with the context for good.
constexpr size_t kMaxSearchWorkspace = size_t{1} << 30;

const float kOne = 1.0f;
const float kZero = 0.0f;

cudnnDataType_t ConvDataType(DType t, const std::string& layer) {
  switch (t) {
    case DType::kF32:
      return CUDNN_DATA_FLOAT;
    case DType::kF16:
      return CUDNN_DATA_HALF;
    case DType::kBF16:
      return CUDNN_DATA_BFLOAT16;
    default:
      throw Error(StrCat(layer,
                         ": the GPU convolution takes f32 tensors (f16/bf16 for mixed "
                         "precision), got ",
                         DTypeName(t)));
  }
}

int ToInt(int64_t v, const char* what, const std::string& layer) {
  CNNFLOW_ENFORCE(v >= 0 && v <= INT_MAX, layer, ": ", what, " ", v,
                  " is too large for cuDNN (int dimensions)");
  return static_cast<int>(v);
}

// Picks among `count` search results; throws naming the layer when none fits.
template <typename Perf>
const Perf& Pick(const std::vector<Perf>& perf, int count, size_t limit, cudnnDataType_t type,
                 const std::string& layer, const char* pass) {
  std::vector<int> status(count), math(count);
  std::vector<size_t> memory(count);
  for (int i = 0; i < count; ++i) {
    status[i] = static_cast<int>(perf[i].status);
    math[i] = static_cast<int>(perf[i].mathType);
    memory[i] = perf[i].memory;
  }
  const int i = detail::PickCudnnAlgo(status.data(), math.data(), memory.data(), count, limit,
                                      type != CUDNN_DATA_FLOAT);
  if (i < 0) {
    throw Error(StrCat(layer, ": cuDNN found no usable ", pass, " algorithm (", count,
                       " tried, workspace limit ", limit, " bytes)"));
  }
  return perf[i];
}

// The workspace an algorithm search gets: what the hungriest algorithm asks
// for, within kMaxSearchWorkspace and a quarter of the free device memory.
size_t SearchBudget(size_t wanted) {
  size_t free_bytes = 0, total = 0;
  CNNFLOW_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return std::min({wanted, kMaxSearchWorkspace, free_bytes / 4});
}

// Workspace for a search: halves the budget while the allocation fails.
// Also waits for the compute stream: the search times kernels on real
// buffers that earlier work on the stream writes (once per batch size).
void* SearchWorkspace(CudaContext& ctx, size_t* bytes) {
  ctx.Synchronize();
  while (*bytes > 0) {
    try {
      return ctx.Workspace(*bytes);
    } catch (const std::exception&) {
      *bytes /= 2;
    }
  }
  return nullptr;
}

// The cuDNN state of one convolution layer: descriptors and the chosen
// algorithms per batch size.
class CudnnConv {
 public:
  CudnnConv() = default;
  ~CudnnConv();
  CudnnConv(const CudnnConv&) = delete;
  CudnnConv& operator=(const CudnnConv&) = delete;

  // x: [N, C, H, W] (or [N, C, L] with H = 1), w: the weight, bias: [K] or
  // null -> y: [N, K, H', W'] (overwritten).
  void Forward(const std::string& layer, const Conv2dGeometry& g, const Tensor& x, const Tensor& w,
               const Tensor* bias, Tensor& y);
  // dy: [N, K, H', W'] -> dx (overwritten; null: skipped); adds into dw and
  // db (null: no bias).
  void Backward(const std::string& layer, const Conv2dGeometry& g, const Tensor& x, const Tensor& w,
                const Tensor& dy, Tensor* dx, Tensor& dw, Tensor* db);

 private:
  struct Choice {
    bool found = false;
    int algo = 0;
    cudnnMathType_t math = CUDNN_DEFAULT_MATH;
    size_t workspace = 0;
  };
  struct Algos {
    Choice fwd, bwd_data, bwd_filter;
  };
  enum Pass { kFwd = 0, kBwdData = 1, kBwdFilter = 2 };

  // Makes the descriptors (first call) and sets them for a batch of n
  // (when n or the dtype changed); returns the batch's algorithm slot.
  Algos& Prepare(CudaContext& ctx, const std::string& layer, const Conv2dGeometry& g,
                 const Tensor& x, const Tensor& w);
  void FindForward(CudaContext& ctx, const std::string& layer, const Tensor& x, const Tensor& w,
                   Tensor& y, Choice& c);
  void FindBackwardData(CudaContext& ctx, const std::string& layer, const Tensor& w,
                        const Tensor& dy, Tensor& dx, Choice& c);
  void FindBackwardFilter(CudaContext& ctx, const std::string& layer, const Tensor& x,
                          const Tensor& dy, const Tensor& w, Choice& c);
  // The math type the search starts from.
  cudnnMathType_t SearchMath() const {
    return type_ == CUDNN_DATA_FLOAT ? CUDNN_DEFAULT_MATH : CUDNN_TENSOR_OP_MATH;
  }

  cudnnTensorDescriptor_t x_desc_ = nullptr, y_desc_ = nullptr, bias_desc_ = nullptr;
  cudnnFilterDescriptor_t w_desc_ = nullptr;
  cudnnConvolutionDescriptor_t conv_desc_[3] = {nullptr, nullptr, nullptr};
  bool created_ = false;
  bool static_set_ = false;  // filter, convolution and bias descriptors
  cudnnDataType_t type_ = CUDNN_DATA_FLOAT;
  int64_t desc_n_ = -1;
  int device_ = -1;
  std::map<int64_t, Algos> algos_;  // by batch size
};

CudnnConv::~CudnnConv() {
  // Destroy calls cannot fail in a way worth reporting from a destructor.
  if (x_desc_) cudnnDestroyTensorDescriptor(x_desc_);
  if (y_desc_) cudnnDestroyTensorDescriptor(y_desc_);
  if (bias_desc_) cudnnDestroyTensorDescriptor(bias_desc_);
  if (w_desc_) cudnnDestroyFilterDescriptor(w_desc_);
  for (auto* d : conv_desc_) {
    if (d) cudnnDestroyConvolutionDescriptor(d);
  }
}

CudnnConv::Algos& CudnnConv::Prepare(CudaContext& ctx, const std::string& layer,
                                     const Conv2dGeometry& g, const Tensor& x, const Tensor& w) {
  const int64_t n = x.dim(0);
  CNNFLOW_ENFORCE(x.is_contiguous() && w.is_contiguous(), layer,
                  ": the GPU convolution needs contiguous tensors, got x ", x.shape());
  CNNFLOW_ENFORCE(x.numel() == n * g.in_channels * g.in_h * g.in_w, layer, ": input ", x.shape(),
                  " does not match the built input [N, ", g.in_channels, ", ", g.in_h, ", ", g.in_w,
                  "]");
  CNNFLOW_ENFORCE(w.device() == x.device(), layer, ": weight on ", w.device().ToString(),
                  ", input on ", x.device().ToString());
  const cudnnDataType_t type = ConvDataType(x.dtype(), layer);
  CNNFLOW_ENFORCE(w.dtype() == x.dtype(), layer, ": weight is ", DTypeName(w.dtype()), ", input ",
                  DTypeName(x.dtype()));
  if (!created_) {
    CNNFLOW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_desc_));
    CNNFLOW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_desc_));
    CNNFLOW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&bias_desc_));
    CNNFLOW_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_desc_));
    for (auto& d : conv_desc_) CNNFLOW_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d));
    created_ = true;
  }
  if (ctx.device() != device_) {  // algorithms are per GPU
    algos_.clear();
    device_ = ctx.device();
  }
  if (!static_set_ || type != type_) {
    type_ = type;
    // Half data accumulates in f32 (PyTorch's choice too).
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    CNNFLOW_CUDNN_CHECK(cudnnSetFilter4dDescriptor(
        w_desc_, type, CUDNN_TENSOR_NCHW, ToInt(g.out_channels, "output channels", layer),
        ToInt(g.in_per_group(), "input channels per group", layer),
        ToInt(g.kernel_h, "kernel height", layer), ToInt(g.kernel_w, "kernel width", layer)));
    for (auto* d : conv_desc_) {
      CNNFLOW_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
          d, ToInt(g.pad_h, "pad", layer), ToInt(g.pad_w, "pad", layer),
          ToInt(g.stride_h, "stride", layer), ToInt(g.stride_w, "stride", layer),
          ToInt(g.dilation_h, "dilation", layer), ToInt(g.dilation_w, "dilation", layer),
          CUDNN_CROSS_CORRELATION, compute));
      CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d, ToInt(g.groups, "groups", layer)));
      CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionMathType(d, SearchMath()));
    }
    CNNFLOW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(bias_desc_, CUDNN_TENSOR_NCHW, type, 1,
                                                   static_cast<int>(g.out_channels), 1, 1));
    static_set_ = true;
    desc_n_ = -1;
    algos_.clear();
  }
  if (n != desc_n_) {
    const int ni = ToInt(n, "batch size", layer);
    CNNFLOW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(
        x_desc_, CUDNN_TENSOR_NCHW, type, ni, ToInt(g.in_channels, "input channels", layer),
        ToInt(g.in_h, "input height", layer), ToInt(g.in_w, "input width", layer)));
    CNNFLOW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(
        y_desc_, CUDNN_TENSOR_NCHW, type, ni, static_cast<int>(g.out_channels),
        ToInt(g.out_h, "output height", layer), ToInt(g.out_w, "output width", layer)));
    int on = 0, oc = 0, oh = 0, ow = 0;
    CNNFLOW_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv_desc_[kFwd], x_desc_, w_desc_,
                                                              &on, &oc, &oh, &ow));
    if (on != ni || oc != g.out_channels || oh != g.out_h || ow != g.out_w) {
      throw Error(StrCat(layer, ": cuDNN's output shape [", on, ", ", oc, ", ", oh, ", ", ow,
                         "] differs from the layer's [", n, ", ", g.out_channels, ", ", g.out_h,
                         ", ", g.out_w, "]"));
    }
    desc_n_ = n;
  }
  return algos_[n];
}

void CudnnConv::FindForward(CudaContext& ctx, const std::string& layer, const Tensor& x,
                            const Tensor& w, Tensor& y, Choice& c) {
  cudnnHandle_t h = ctx.cudnn();
  cudnnConvolutionDescriptor_t conv = conv_desc_[kFwd];
  CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, SearchMath()));
  size_t wanted = 0;
  for (int a = 0; a < CUDNN_CONVOLUTION_FWD_ALGO_COUNT; ++a) {
    size_t b = 0;
    if (cudnnGetConvolutionForwardWorkspaceSize(h, x_desc_, w_desc_, conv, y_desc_,
                                                static_cast<cudnnConvolutionFwdAlgo_t>(a),
                                                &b) == CUDNN_STATUS_SUCCESS) {
      wanted = std::max(wanted, b);
    }
  }
  size_t budget = SearchBudget(wanted);
  void* ws = SearchWorkspace(ctx, &budget);
  int max_count = 0;
  CNNFLOW_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(std::max(max_count, 1));
  int count = 0;
  // Writes y: the forward pass overwrites it next.
  CNNFLOW_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
      h, x_desc_, x.raw_data(), w_desc_, w.raw_data(), conv, y_desc_, y.raw_data(),
      static_cast<int>(perf.size()), &count, perf.data(), ws, budget));
  const auto& best = Pick(perf, count, budget, type_, layer, "forward");
  c.algo = static_cast<int>(best.algo);
  c.math = best.mathType;
  CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, c.math));
  size_t need = 0;
  CNNFLOW_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, x_desc_, w_desc_, conv, y_desc_,
                                                              best.algo, &need));
  c.workspace = std::max(need, best.memory);
  c.found = true;
}

void CudnnConv::FindBackwardData(CudaContext& ctx, const std::string& layer, const Tensor& w,
                                 const Tensor& dy, Tensor& dx, Choice& c) {
  cudnnHandle_t h = ctx.cudnn();
  cudnnConvolutionDescriptor_t conv = conv_desc_[kBwdData];
  CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, SearchMath()));
  size_t wanted = 0;
  for (int a = 0; a < CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT; ++a) {
    size_t b = 0;
    if (cudnnGetConvolutionBackwardDataWorkspaceSize(h, w_desc_, y_desc_, conv, x_desc_,
                                                     static_cast<cudnnConvolutionBwdDataAlgo_t>(a),
                                                     &b) == CUDNN_STATUS_SUCCESS) {
      wanted = std::max(wanted, b);
    }
  }
  size_t budget = SearchBudget(wanted);
  void* ws = SearchWorkspace(ctx, &budget);
  int max_count = 0;
  CNNFLOW_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(std::max(max_count, 1));
  int count = 0;
  // Writes dx: the backward pass overwrites it next.
  CNNFLOW_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
      h, w_desc_, w.raw_data(), y_desc_, dy.raw_data(), conv, x_desc_, dx.raw_data(),
      static_cast<int>(perf.size()), &count, perf.data(), ws, budget));
  const auto& best = Pick(perf, count, budget, type_, layer, "backward-data");
  c.algo = static_cast<int>(best.algo);
  c.math = best.mathType;
  CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, c.math));
  size_t need = 0;
  CNNFLOW_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, w_desc_, y_desc_, conv,
                                                                   x_desc_, best.algo, &need));
  c.workspace = std::max(need, best.memory);
  c.found = true;
}

void CudnnConv::FindBackwardFilter(CudaContext& ctx, const std::string& layer, const Tensor& x,
                                   const Tensor& dy, const Tensor& w, Choice& c) {
  cudnnHandle_t h = ctx.cudnn();
  cudnnConvolutionDescriptor_t conv = conv_desc_[kBwdFilter];
  CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, SearchMath()));
  size_t wanted = 0;
  for (int a = 0; a < CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT; ++a) {
    size_t b = 0;
    if (cudnnGetConvolutionBackwardFilterWorkspaceSize(
            h, x_desc_, y_desc_, conv, w_desc_, static_cast<cudnnConvolutionBwdFilterAlgo_t>(a),
            &b) == CUDNN_STATUS_SUCCESS) {
      wanted = std::max(wanted, b);
    }
  }
  size_t budget = SearchBudget(wanted);
  void* ws = SearchWorkspace(ctx, &budget);
  int max_count = 0;
  CNNFLOW_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(std::max(max_count, 1));
  int count = 0;
  // The search overwrites its dw: a scratch one, since the real gradient
  // accumulates. The search blocks, so the scratch may go back at once.
  Tensor scratch = Tensor::Empty(w.shape(), w.dtype(), w.device());
  CNNFLOW_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
      h, x_desc_, x.raw_data(), y_desc_, dy.raw_data(), conv, w_desc_, scratch.raw_data(),
      static_cast<int>(perf.size()), &count, perf.data(), ws, budget));
  const auto& best = Pick(perf, count, budget, type_, layer, "backward-filter");
  c.algo = static_cast<int>(best.algo);
  c.math = best.mathType;
  CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, c.math));
  size_t need = 0;
  CNNFLOW_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x_desc_, y_desc_, conv,
                                                                     w_desc_, best.algo, &need));
  c.workspace = std::max(need, best.memory);
  c.found = true;
}

void CudnnConv::Forward(const std::string& layer, const Conv2dGeometry& g, const Tensor& x,
                        const Tensor& w, const Tensor* bias, Tensor& y) {
  CudaContext& ctx = CudaContext::For(x.device());
  Algos& a = Prepare(ctx, layer, g, x, w);
  CNNFLOW_ENFORCE(y.is_contiguous() && y.dtype() == x.dtype() &&
                      y.numel() == x.dim(0) * g.out_channels * g.out_plane(),
                  layer, ": output ", y.shape(), " does not match [N, ", g.out_channels, ", ",
                  g.out_h, ", ", g.out_w, "]");
  if (!a.fwd.found) FindForward(ctx, layer, x, w, y, a.fwd);
  cudnnHandle_t h = ctx.cudnn();
  // Each batch size may have chosen another math type: set it every call
  // (a host-side field of the descriptor).
  CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_[kFwd], a.fwd.math));
  void* ws = ctx.Workspace(a.fwd.workspace);
  CNNFLOW_CUDNN_CHECK(cudnnConvolutionForward(h, &kOne, x_desc_, x.raw_data(), w_desc_,
                                              w.raw_data(), conv_desc_[kFwd],
                                              static_cast<cudnnConvolutionFwdAlgo_t>(a.fwd.algo),
                                              ws, a.fwd.workspace, &kZero, y_desc_, y.raw_data()));
  if (bias != nullptr) {
    CNNFLOW_CUDNN_CHECK(
        cudnnAddTensor(h, &kOne, bias_desc_, bias->raw_data(), &kOne, y_desc_, y.raw_data()));
  }
}

void CudnnConv::Backward(const std::string& layer, const Conv2dGeometry& g, const Tensor& x,
                         const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw, Tensor* db) {
  CudaContext& ctx = CudaContext::For(x.device());
  Algos& a = Prepare(ctx, layer, g, x, w);
  CNNFLOW_ENFORCE(dy.is_contiguous() && dy.dtype() == x.dtype() &&
                      dy.numel() == x.dim(0) * g.out_channels * g.out_plane(),
                  layer, ": output gradient ", dy.shape(), " does not match [N, ", g.out_channels,
                  ", ", g.out_h, ", ", g.out_w, "]");
  cudnnHandle_t h = ctx.cudnn();
  if (dx != nullptr) {
    CNNFLOW_ENFORCE(dx->is_contiguous() && dx->numel() == x.numel() && dx->dtype() == x.dtype(),
                    layer, ": input gradient ", dx->shape(), " does not match the input ",
                    x.shape());
    if (!a.bwd_data.found) FindBackwardData(ctx, layer, w, dy, *dx, a.bwd_data);
    CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_[kBwdData], a.bwd_data.math));
    void* ws = ctx.Workspace(a.bwd_data.workspace);
    CNNFLOW_CUDNN_CHECK(cudnnConvolutionBackwardData(
        h, &kOne, w_desc_, w.raw_data(), y_desc_, dy.raw_data(), conv_desc_[kBwdData],
        static_cast<cudnnConvolutionBwdDataAlgo_t>(a.bwd_data.algo), ws, a.bwd_data.workspace,
        &kZero, x_desc_, dx->raw_data()));
  }
  CNNFLOW_ENFORCE(dw.is_contiguous() && dw.numel() == w.numel() && dw.device() == x.device(), layer,
                  ": weight gradient ", dw.shape(), " does not match the weight ", w.shape());
  if (!a.bwd_filter.found) FindBackwardFilter(ctx, layer, x, dy, w, a.bwd_filter);
  CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_[kBwdFilter], a.bwd_filter.math));
  void* ws = ctx.Workspace(a.bwd_filter.workspace);
  // beta = 1: parameter gradients accumulate (ops/layer.h).
  CNNFLOW_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
      h, &kOne, x_desc_, x.raw_data(), y_desc_, dy.raw_data(), conv_desc_[kBwdFilter],
      static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.bwd_filter.algo), ws, a.bwd_filter.workspace,
      &kOne, w_desc_, dw.raw_data()));
  if (db != nullptr) {
    CNNFLOW_CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &kOne, y_desc_, dy.raw_data(), &kOne,
                                                     bias_desc_, db->raw_data()));
  }
}

// conv2d on cuDNN: Conv2d's parameters, shape rule and initialisation.
class Conv2dCudnn : public Conv2d {
 public:
  using Conv2d::Conv2d;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext&) override {
    CNNFLOW_ENFORCE(x.size() == 1, "conv2d '", name(), "' takes one input");
    const Tensor* bias = has_bias() ? &parameters()[1].value : nullptr;
    conv_.Forward(Label(), geometry(), *x[0], parameters()[0].value, bias, y);
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    Tensor* dxp = dx.empty() ? nullptr : dx[0];
    Tensor* db = has_bias() ? &parameters()[1].grad : nullptr;
    conv_.Backward(Label(), geometry(), *x[0], parameters()[0].value, dy, dxp, parameters()[0].grad,
                   db);
  }

 private:
  // "<type> 'name'", for messages (made once: Forward runs every step).
  const std::string& Label() const {
    if (label_.empty()) label_ = StrCat(type(), " '", name(), "'");
    return label_;
  }
  mutable std::string label_;
  CudnnConv conv_;
};

// conv1d on cuDNN: [N, C, L] is [N, C, 1, L] to cuDNN, the weight
// [K, C/groups, k] a [K, C/groups, 1, k] filter (same memory).
class Conv1dCudnn : public Conv1d {
 public:
  using Conv1d::Conv1d;

  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext&) override {
    CNNFLOW_ENFORCE(x.size() == 1 && x[0]->rank() == 3, "conv1d '", name(),
                    "' takes one [N, C, L] input");
    const Tensor* bias = has_bias() ? &parameters()[1].value : nullptr;
    conv_.Forward(Label(), geometry(), *x[0], parameters()[0].value, bias, y);
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    Tensor* dxp = dx.empty() ? nullptr : dx[0];
    Tensor* db = has_bias() ? &parameters()[1].grad : nullptr;
    conv_.Backward(Label(), geometry(), *x[0], parameters()[0].value, dy, dxp, parameters()[0].grad,
                   db);
  }

 private:
  // "<type> 'name'", for messages (made once: Forward runs every step).
  const std::string& Label() const {
    if (label_.empty()) label_ = StrCat(type(), " '", name(), "'");
    return label_;
  }
  mutable std::string label_;
  CudnnConv conv_;
};

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(conv2d, Conv2dCudnn);
CNNFLOW_REGISTER_CUDA_LAYER(conv1d, Conv1dCudnn);

}  // namespace cnnflow
