// cuDNN kernels of conv2d and conv1d (the CUDA classes of ops/layers/conv2d.h and
// ops/layers/conv1d.h), on the legacy cuDNN API.
//
// conv1d is conv2d on [N, C, 1, L] with a 1 x k kernel (Conv1d's geometry
// already is that 2D geometry), so both share CudnnConv below.
//
// Per layer: descriptors are made once and re-set only when the batch size
// changes; the algorithms of each batch size are chosen once by cuDNN's
// search (cudnnFind*AlgorithmEx on the real buffers, which blocks the host:
// once per batch size) and cached; the workspace comes from
// CudaContext::Workspace. Steady-state calls only issue work on the
// device's compute stream: no host synchronisation.
//
// Precision: f32 convolutions run with CUDNN_DEFAULT_MATH, which lets cuDNN
// use TF32 tensor cores on Ampere and later (PyTorch's default,
// torch.backends.cudnn.allow_tf32 = True); with graph.tf32: false
// (CudaContext::math()) they run with CUDNN_FMA_MATH and no tensor-op
// algorithm is picked: full f32. Algorithms that would convert f32 data
// down to f16 are never chosen.
// graph.deterministic (torch.backends.cudnn.deterministic): the algorithms
// come from cuDNN's heuristics (cudnnGet*Algorithm_v7: no timing, the same
// pick every run), CUDNN_DETERMINISTIC ones only, each recorded in the run's
// picks file (ops/cuda/cudnn_picks.h) that a resume loads.
// Mixed precision (x, y, dy, dx in f16 or bf16; parameters and their
// gradients f32, ops/model.h): cuDNN computes on half copies of the weight
// and bias, refreshed every forward, with CUDNN_TENSOR_OP_MATH and an f32
// compute type (f32 accumulation). The weight gradient comes out in half
// into a scratch and is added into the f32 gradient (cuda::AddCast); the
// bias gradient is summed by cuDNN in f32 from an f32 copy of dy, straight
// into the f32 gradient (f32 in and out is the combination cuDNN surely
// supports; biased convolutions are rare in mixed-precision nets).
// Channels-last (graph.channels_last, Layer::SetChannelsLast): a conv2d with
// either side NHWC computes all in NHWC, as PyTorch does (x, y and the
// filter, KRSC: cuDNN's tensor-core kernels want them so); the weight is
// copied to KRSC (in the compute dtype) every forward and its gradient
// comes back KRSC into a scratch that is added, transposed, into the f32
// KCRS gradient (cuda::ChangeLayout). A side stored NCHW (the model's input,
// or a layer without a channels-last kernel) is converted on the way.
#include <cudnn.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cudnn_picks.h"
#include "ops/cuda/cudnn_util.h"
#include "ops/cuda/kernels.h"
#include "ops/layers/conv1d.h"
#include "ops/layers/conv2d.h"
#include "ops/trace.h"

namespace cnnflow {

namespace detail {

int PickCudnnAlgo(const int* status, const int* math_type, const int* determinism,
                  const size_t* memory, int count, size_t workspace_limit,
                  const CudnnPickRules& rules) {
  const int converting = static_cast<int>(CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
  for (int i = 0; i < count; ++i) {
    if (status[i] != static_cast<int>(CUDNN_STATUS_SUCCESS)) continue;
    if (memory[i] > workspace_limit) continue;
    if (!rules.allow_down_conversion && math_type[i] == converting) continue;
    if (!rules.allow_tensor_ops &&
        (math_type[i] == static_cast<int>(CUDNN_TENSOR_OP_MATH) || math_type[i] == converting)) {
      continue;
    }
    if (rules.deterministic_only && determinism[i] != static_cast<int>(CUDNN_DETERMINISTIC)) {
      continue;
    }
    return i;
  }
  return -1;
}

}  // namespace detail

namespace {

using detail::CudnnInt;
using detail::kCudnnOne;
using detail::kCudnnZero;

// The most workspace an algorithm search may use: fast algorithms (FFT,
// Winograd) ask for a lot, but the block stays with the context for good.
constexpr size_t kMaxSearchWorkspace = size_t{1} << 30;

// What `math` (graph.tf32, graph.deterministic) lets a convolution on
// `type` data take.
detail::CudnnPickRules PickRules(cudnnDataType_t type, const GpuMathOptions& math) {
  detail::CudnnPickRules r;
  r.allow_down_conversion = detail::CudnnMayDownConvert(type);
  r.allow_tensor_ops = type != CUDNN_DATA_FLOAT || math.tf32;
  r.deterministic_only = math.deterministic;
  return r;
}

// Picks among `count` search results; throws naming the layer when none
// fits.
template <typename Perf>
const Perf& Pick(const std::vector<Perf>& perf, int count, size_t limit,
                 const detail::CudnnPickRules& rules, const std::string& layer, const char* pass) {
  std::vector<int> status(count), math(count), determinism(count);
  std::vector<size_t> memory(count);
  for (int i = 0; i < count; ++i) {
    status[i] = static_cast<int>(perf[i].status);
    math[i] = static_cast<int>(perf[i].mathType);
    determinism[i] = static_cast<int>(perf[i].determinism);
    memory[i] = perf[i].memory;
  }
  const int i = detail::PickCudnnAlgo(status.data(), math.data(), determinism.data(), memory.data(),
                                      count, limit, rules);
  if (i < 0) {
    throw Error(StrCat(layer, ": cuDNN found no usable ", pass, " algorithm (", count,
                       " tried, workspace limit ", limit, " bytes",
                       rules.deterministic_only ? ", deterministic ones only" : "",
                       rules.allow_tensor_ops ? "" : ", no TF32", ")"));
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

// The algorithm chosen for one pass and batch size.
struct AlgoChoice {
  bool found = false;
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};

// `master` (f32) in x's dtype: itself when they agree, else `copy`
// (allocated on first use) refreshed from it.
const Tensor& ComputeCopy(const Tensor& master, const Tensor& x, Tensor* copy) {
  if (master.dtype() == x.dtype()) return master;
  if (!copy->defined() || copy->dtype() != x.dtype() || copy->device() != x.device() ||
      copy->shape() != master.shape()) {
    *copy = Tensor::Empty(master.shape(), x.dtype(), x.device());
  }
  cuda::Cast(master, *copy);
  return *copy;
}

// The cuDNN state of one convolution layer: descriptors, the chosen
// algorithms per batch size, and the half copies of the parameters.
class CudnnConv {
 public:
  CudnnConv() = default;
  ~CudnnConv();
  CudnnConv(const CudnnConv&) = delete;
  CudnnConv& operator=(const CudnnConv&) = delete;

  // The layouts of x and y (true: NHWC), before the first Forward.
  void SetLayouts(bool nhwc_in, bool nhwc_out) {
    nhwc_in_ = nhwc_in;
    nhwc_out_ = nhwc_out;
    static_set_ = false;
  }

  // x: [N, C, H, W] (or [N, C, L] with H = 1), w: the weight, bias: [K] or
  // null (both f32) -> y: [N, K, H', W'] (overwritten), in x's dtype.
  void Forward(const std::string& layer, const Conv2dGeometry& g, const Tensor& x, const Tensor& w,
               const Tensor* bias, Tensor& y);
  // dy: [N, K, H', W'] (x's dtype) -> dx (overwritten; null: skipped);
  // adds into dw and db (f32; db null: no bias).
  void Backward(const std::string& layer, const Conv2dGeometry& g, const Tensor& x, const Tensor& w,
                const Tensor& dy, Tensor* dx, Tensor& dw, Tensor* db);

 private:
  struct Algos {
    AlgoChoice fwd, bwd_data, bwd_filter;
  };
  enum Pass { kFwd = 0, kBwdData = 1, kBwdFilter = 2 };

  // Makes the descriptors (first call) and sets them for a batch of n
  // (when n or the dtype changed); returns the batch's algorithm slot.
  // w: the weight cuDNN computes with (x's dtype).
  Algos& Prepare(CudaContext& ctx, const std::string& layer, const Conv2dGeometry& g,
                 const Tensor& x, const Tensor& w);
  // One algorithm search: sizes every algorithm's workspace to size the
  // search's, lets cuDNN time them on the real buffers and picks.
  // workspace_size(algo, &bytes), find(requested, &count, perf, workspace,
  // bytes) and get(requested, &count, perf) call the pass's cuDNN functions.
  // graph.deterministic (Deterministic) asks get, cuDNN's heuristics, instead.
  template <typename Perf, typename SizeFn, typename FindFn, typename GetFn>
  AlgoChoice Search(CudaContext& ctx, const std::string& layer, const char* pass, Pass p,
                    int algo_count, int max_count, SizeFn workspace_size, FindFn find, GetFn get);
  // graph.deterministic: the pick recorded for this pass and shape
  // (ops/cuda/cudnn_picks.h), else the first deterministic algorithm of
  // cuDNN's heuristics (no timing, so every run picks the same), recorded.
  template <typename Perf, typename SizeFn, typename GetFn>
  AlgoChoice Deterministic(CudaContext& ctx, const std::string& layer, const char* pass, Pass p,
                           int max_count, const detail::CudnnPickRules& rules,
                           SizeFn workspace_size, GetFn get);
  // The chosen algorithm's math set on the pass's descriptor and its
  // workspace sized.
  template <typename SizeFn>
  AlgoChoice Choose(const std::string& layer, const char* pass, Pass p, int algo,
                    cudnnMathType_t math, size_t reported, SizeFn workspace_size);
  AlgoChoice FindForward(CudaContext& ctx, const std::string& layer, const Tensor& x,
                         const Tensor& w, Tensor& y);
  AlgoChoice FindBackwardData(CudaContext& ctx, const std::string& layer, const Tensor& w,
                              const Tensor& dy, Tensor& dx);
  AlgoChoice FindBackwardFilter(CudaContext& ctx, const std::string& layer, const Tensor& x,
                                const Tensor& dy, const Tensor& w);
  // The math type the search starts from: f32 data with TF32 allowed
  // (graph.tf32) the default (TF32 where the GPU has it), without it FMA.
  cudnnMathType_t SearchMath(const GpuMathOptions& math) const {
    if (type_ != CUDNN_DATA_FLOAT) return CUDNN_TENSOR_OP_MATH;
    return math.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  }

  // The layout cuDNN computes in: NHWC when either side is.
  bool nhwc() const { return nhwc_in_ || nhwc_out_; }
  cudnnTensorFormat_t Format() const { return nhwc() ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW; }
  // The weight cuDNN computes with: w itself (f32, NCHW), else w_compute_
  // refreshed from it (x's dtype, KRSC when nhwc()).
  const Tensor& ComputeWeight(const Tensor& w, const Tensor& x);
  // `t` in the computing layout: itself, or converted into `*copy` (to NHWC).
  const Tensor& InComputeLayout(const Tensor& t, bool t_nhwc, Tensor* copy) const;

  // x, y, filter and bias in the compute dtype; y32 and bias32 in f32 for
  // the bias gradient.
  cudnnTensorDescriptor_t x_desc_ = nullptr, y_desc_ = nullptr, bias_desc_ = nullptr;
  cudnnTensorDescriptor_t y32_desc_ = nullptr, bias32_desc_ = nullptr;
  cudnnFilterDescriptor_t w_desc_ = nullptr;
  cudnnConvolutionDescriptor_t conv_desc_[3] = {nullptr, nullptr, nullptr};
  bool created_ = false;
  bool static_set_ = false;  // filter, convolution and bias descriptors
  cudnnDataType_t type_ = CUDNN_DATA_FLOAT;
  DType dtype_ = DType::kF32;  // what type_ stands for
  int64_t desc_n_ = -1;
  std::string shape_key_;  // the geometry, batch and dtype: a picks file's key
  int device_ = -1;
  std::map<int64_t, Algos> algos_;  // by batch size
  // The weight and bias as cuDNN computes with them (mixed precision: in
  // the compute dtype; channels-last: the weight KRSC), refreshed by each
  // Forward and used by the Backward after it.
  Tensor w_compute_, b_half_;
  bool nhwc_in_ = false, nhwc_out_ = false;
  // An NCHW x converted to NHWC by Forward, for the Backward after it.
  Tensor x_nhwc_;
};

CudnnConv::~CudnnConv() {
  // Destroy calls cannot fail in a way worth reporting from a destructor.
  for (auto* d : {x_desc_, y_desc_, bias_desc_, y32_desc_, bias32_desc_}) {
    if (d) cudnnDestroyTensorDescriptor(d);
  }
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
  const cudnnDataType_t type = detail::CudnnDataTypeOf(x.dtype(), layer);
  CNNFLOW_ENFORCE(w.dtype() == x.dtype(), layer, ": weight is ", DTypeName(w.dtype()), ", input ",
                  DTypeName(x.dtype()));
  if (!created_) {
    for (auto* d : {&x_desc_, &y_desc_, &bias_desc_, &y32_desc_, &bias32_desc_}) {
      CNNFLOW_CUDNN_CHECK(cudnnCreateTensorDescriptor(d));
    }
    CNNFLOW_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_desc_));
    for (auto& d : conv_desc_) CNNFLOW_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d));
    created_ = true;
  }
  if (ctx.device() != device_) {  // algorithms are per GPU
    algos_.clear();
    device_ = ctx.device();
  }
  const int k = CudnnInt(g.out_channels, layer, "output channels");
  if (!static_set_ || type != type_) {
    type_ = type;
    dtype_ = x.dtype();
    // Half data accumulates in f32 (PyTorch's choice too).
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    CNNFLOW_CUDNN_CHECK(cudnnSetFilter4dDescriptor(
        w_desc_, type, Format(), k, CudnnInt(g.in_per_group(), layer, "input channels per group"),
        CudnnInt(g.kernel_h, layer, "kernel height"), CudnnInt(g.kernel_w, layer, "kernel width")));
    for (auto* d : conv_desc_) {
      CNNFLOW_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
          d, CudnnInt(g.pad_h, layer, "pad"), CudnnInt(g.pad_w, layer, "pad"),
          CudnnInt(g.stride_h, layer, "stride"), CudnnInt(g.stride_w, layer, "stride"),
          CudnnInt(g.dilation_h, layer, "dilation"), CudnnInt(g.dilation_w, layer, "dilation"),
          CUDNN_CROSS_CORRELATION, compute));
      CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d, CudnnInt(g.groups, layer, "groups")));
      CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionMathType(d, SearchMath(ctx.math())));
    }
    CNNFLOW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(bias_desc_, Format(), type, 1, k, 1, 1));
    CNNFLOW_CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(bias32_desc_, Format(), CUDNN_DATA_FLOAT, 1, k, 1, 1));
    static_set_ = true;
    desc_n_ = -1;
    algos_.clear();
  }
  if (n != desc_n_) {
    const int ni = CudnnInt(n, layer, "batch size");
    const int oh = CudnnInt(g.out_h, layer, "output height");
    const int ow = CudnnInt(g.out_w, layer, "output width");
    CNNFLOW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(
        x_desc_, Format(), type, ni, CudnnInt(g.in_channels, layer, "input channels"),
        CudnnInt(g.in_h, layer, "input height"), CudnnInt(g.in_w, layer, "input width")));
    CNNFLOW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y_desc_, Format(), type, ni, k, oh, ow));
    CNNFLOW_CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(y32_desc_, Format(), CUDNN_DATA_FLOAT, ni, k, oh, ow));
    int on = 0, oc = 0, ch = 0, cw = 0;
    CNNFLOW_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv_desc_[kFwd], x_desc_, w_desc_,
                                                              &on, &oc, &ch, &cw));
    if (on != ni || oc != k || ch != oh || cw != ow) {
      throw Error(StrCat(layer, ": cuDNN's output shape [", on, ", ", oc, ", ", ch, ", ", cw,
                         "] differs from the layer's [", n, ", ", k, ", ", oh, ", ", ow, "]"));
    }
    desc_n_ = n;
    shape_key_ =
        StrCat(DTypeName(dtype_), " n", n, " c", g.in_channels, " ", g.in_h, "x", g.in_w, " k",
               g.out_channels, " ", g.kernel_h, "x", g.kernel_w, " pad", g.pad_h, ",", g.pad_w,
               " stride", g.stride_h, ",", g.stride_w, " dilation", g.dilation_h, ",", g.dilation_w,
               " groups", g.groups, nhwc() ? " nhwc" : "");
  }
  return algos_[n];
}

// The GPU model, its compute capability and the cuDNN version: the machine
// of a picks file's line (ops/cuda/cudnn_picks.h).
const std::string& GpuMachine(int device) {
  static std::mutex mu;
  static auto* names = new std::map<int, std::string>();
  std::lock_guard<std::mutex> lock(mu);
  std::string& name = (*names)[device];
  if (name.empty()) {
    cudaDeviceProp prop{};
    CNNFLOW_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    name = StrCat(prop.name, " sm_", prop.major, prop.minor, " cudnn ", cudnnGetVersion());
  }
  return name;
}

template <typename SizeFn>
AlgoChoice CudnnConv::Choose(const std::string& layer, const char* pass, Pass p, int algo,
                             cudnnMathType_t math, size_t reported, SizeFn workspace_size) {
  AlgoChoice c;
  c.algo = algo;
  c.math = math;
  CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_[p], c.math));
  size_t need = 0;
  const cudnnStatus_t sized = workspace_size(c.algo, &need);
  if (sized != CUDNN_STATUS_SUCCESS) {
    throw Error(StrCat(layer, ": cuDNN cannot size the workspace of its chosen ", pass,
                       " algorithm ", c.algo, ": ", cudnnGetErrorString(sized)));
  }
  c.workspace = std::max(need, reported);
  c.found = true;
  return c;
}

template <typename Perf, typename SizeFn, typename GetFn>
AlgoChoice CudnnConv::Deterministic(CudaContext& ctx, const std::string& layer, const char* pass,
                                    Pass p, int max_count, const detail::CudnnPickRules& rules,
                                    SizeFn workspace_size, GetFn get) {
  const std::string& machine = GpuMachine(ctx.device());
  const std::string key = StrCat(pass, " ", shape_key_, rules.allow_tensor_ops ? "" : " fma");
  std::string pick = cuda::FindCudnnPick(machine, key);
  if (pick.empty()) {
    std::vector<Perf> perf(std::max(max_count, 1));
    int count = 0;
    const cudnnStatus_t got = get(static_cast<int>(perf.size()), &count, perf.data());
    if (got != CUDNN_STATUS_SUCCESS) {
      throw Error(StrCat(layer, ": cuDNN's ", pass, " heuristics failed: ",
                         cudnnGetErrorString(got), " (", DTypeName(dtype_), " data)"));
    }
    // A fixed limit, not the free memory of the moment: the same pick every run.
    const Perf& best = Pick(perf, count, kMaxSearchWorkspace, rules, layer, pass);
    pick = cuda::RecordCudnnPick(
        machine, key,
        StrCat(static_cast<int>(best.algo), " ",
               static_cast<int>(rules.allow_tensor_ops ? best.mathType : CUDNN_FMA_MATH)));
  }
  int algo = -1, math = -1;
  std::istringstream in(pick);
  if (!(in >> algo >> math) || algo < 0 || math < 0) {
    throw Error(StrCat(layer, ": the recorded cuDNN ", pass, " pick '", pick, "' for '", key,
                       "' is not 'algo math'"));
  }
  return Choose(layer, pass, p, algo, static_cast<cudnnMathType_t>(math), 0, workspace_size);
}

template <typename Perf, typename SizeFn, typename FindFn, typename GetFn>
AlgoChoice CudnnConv::Search(CudaContext& ctx, const std::string& layer, const char* pass, Pass p,
                             int algo_count, int max_count, SizeFn workspace_size, FindFn find,
                             GetFn get) {
  cudnnConvolutionDescriptor_t conv = conv_desc_[p];
  const GpuMathOptions math = ctx.math();
  CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, SearchMath(math)));
  const detail::CudnnPickRules rules = PickRules(type_, math);
  if (math.deterministic) {
    return Deterministic<Perf>(ctx, layer, pass, p, max_count, rules, workspace_size, get);
  }
  size_t wanted = 0;
  for (int a = 0; a < algo_count; ++a) {
    size_t b = 0;
    if (workspace_size(a, &b) == CUDNN_STATUS_SUCCESS) wanted = std::max(wanted, b);
  }
  size_t budget = SearchBudget(wanted);
  void* ws = SearchWorkspace(ctx, &budget);
  std::vector<Perf> perf(std::max(max_count, 1));
  int count = 0;
  const cudnnStatus_t found = find(static_cast<int>(perf.size()), &count, perf.data(), ws, budget);
  if (found != CUDNN_STATUS_SUCCESS) {
    throw Error(StrCat(layer, ": cuDNN's ", pass, " algorithm search failed: ",
                       cudnnGetErrorString(found), " (", DTypeName(dtype_), " data)"));
  }
  const Perf& best = Pick(perf, count, budget, rules, layer, pass);
  // Without TF32 the algorithm runs FMA math whatever the search reported
  // for it (PyTorch does the same).
  return Choose(layer, pass, p, static_cast<int>(best.algo),
                rules.allow_tensor_ops ? best.mathType : CUDNN_FMA_MATH, best.memory,
                workspace_size);
}

AlgoChoice CudnnConv::FindForward(CudaContext& ctx, const std::string& layer, const Tensor& x,
                                  const Tensor& w, Tensor& y) {
  cudnnHandle_t h = ctx.cudnn();
  cudnnConvolutionDescriptor_t conv = conv_desc_[kFwd];
  int max_count = 0;
  CNNFLOW_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max_count));
  return Search<cudnnConvolutionFwdAlgoPerf_t>(
      ctx, layer, "forward", kFwd, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, max_count,
      [&](int a, size_t* bytes) {
        return cudnnGetConvolutionForwardWorkspaceSize(
            h, x_desc_, w_desc_, conv, y_desc_, static_cast<cudnnConvolutionFwdAlgo_t>(a), bytes);
      },
      // Writes y: the forward pass overwrites it next.
      [&](int requested, int* count, cudnnConvolutionFwdAlgoPerf_t* perf, void* ws, size_t bytes) {
        return cudnnFindConvolutionForwardAlgorithmEx(h, x_desc_, x.raw_data(), w_desc_,
                                                      w.raw_data(), conv, y_desc_, y.raw_data(),
                                                      requested, count, perf, ws, bytes);
      },
      [&](int requested, int* count, cudnnConvolutionFwdAlgoPerf_t* perf) {
        return cudnnGetConvolutionForwardAlgorithm_v7(h, x_desc_, w_desc_, conv, y_desc_, requested,
                                                      count, perf);
      });
}

AlgoChoice CudnnConv::FindBackwardData(CudaContext& ctx, const std::string& layer, const Tensor& w,
                                       const Tensor& dy, Tensor& dx) {
  cudnnHandle_t h = ctx.cudnn();
  cudnnConvolutionDescriptor_t conv = conv_desc_[kBwdData];
  int max_count = 0;
  CNNFLOW_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max_count));
  return Search<cudnnConvolutionBwdDataAlgoPerf_t>(
      ctx, layer, "backward-data", kBwdData, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, max_count,
      [&](int a, size_t* bytes) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            h, w_desc_, y_desc_, conv, x_desc_, static_cast<cudnnConvolutionBwdDataAlgo_t>(a),
            bytes);
      },
      // Writes dx: the backward pass overwrites it next.
      [&](int requested, int* count, cudnnConvolutionBwdDataAlgoPerf_t* perf, void* ws,
          size_t bytes) {
        return cudnnFindConvolutionBackwardDataAlgorithmEx(
            h, w_desc_, w.raw_data(), y_desc_, dy.raw_data(), conv, x_desc_, dx.raw_data(),
            requested, count, perf, ws, bytes);
      },
      [&](int requested, int* count, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
        return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w_desc_, y_desc_, conv, x_desc_,
                                                           requested, count, perf);
      });
}

AlgoChoice CudnnConv::FindBackwardFilter(CudaContext& ctx, const std::string& layer,
                                         const Tensor& x, const Tensor& dy, const Tensor& w) {
  cudnnHandle_t h = ctx.cudnn();
  cudnnConvolutionDescriptor_t conv = conv_desc_[kBwdFilter];
  int max_count = 0;
  CNNFLOW_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max_count));
  // The search overwrites its dw: a scratch one, since the real gradient
  // accumulates. The search blocks, so the scratch may go back at once.
  Tensor scratch = Tensor::Empty(w.shape(), w.dtype(), w.device());
  return Search<cudnnConvolutionBwdFilterAlgoPerf_t>(
      ctx, layer, "backward-filter", kBwdFilter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, max_count,
      [&](int a, size_t* bytes) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(
            h, x_desc_, y_desc_, conv, w_desc_, static_cast<cudnnConvolutionBwdFilterAlgo_t>(a),
            bytes);
      },
      [&](int requested, int* count, cudnnConvolutionBwdFilterAlgoPerf_t* perf, void* ws,
          size_t bytes) {
        return cudnnFindConvolutionBackwardFilterAlgorithmEx(
            h, x_desc_, x.raw_data(), y_desc_, dy.raw_data(), conv, w_desc_, scratch.raw_data(),
            requested, count, perf, ws, bytes);
      },
      [&](int requested, int* count, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
        return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x_desc_, y_desc_, conv, w_desc_,
                                                             requested, count, perf);
      });
}

const Tensor& CudnnConv::ComputeWeight(const Tensor& w, const Tensor& x) {
  if (!nhwc()) return ComputeCopy(w, x, &w_compute_);
  if (!w_compute_.defined() || w_compute_.dtype() != x.dtype() ||
      w_compute_.device() != x.device() || w_compute_.shape() != w.shape()) {
    w_compute_ = Tensor::Empty(w.shape(), x.dtype(), x.device());
  }
  cuda::ChangeLayout(w, w_compute_, /*to_nhwc=*/true);
  return w_compute_;
}

const Tensor& CudnnConv::InComputeLayout(const Tensor& t, bool t_nhwc, Tensor* copy) const {
  if (!nhwc() || t_nhwc) return t;
  *copy = Tensor::Empty(t.shape(), t.dtype(), t.device());
  cuda::ChangeLayout(t, *copy, /*to_nhwc=*/true);
  return *copy;
}

void CudnnConv::Forward(const std::string& layer, const Conv2dGeometry& g, const Tensor& x,
                        const Tensor& w, const Tensor* bias, Tensor& y) {
  CudaContext& ctx = CudaContext::For(x.device());
  detail::CudnnDataTypeOf(x.dtype(), layer);  // a clear error before any cast
  // Mixed precision: cuDNN computes with half copies of the f32 master
  // parameters, refreshed here (the optimizer has changed them).
  const Tensor& wc = ComputeWeight(w, x);
  const Tensor* bc = bias == nullptr ? nullptr : &ComputeCopy(*bias, x, &b_half_);
  const Tensor& xc = InComputeLayout(x, nhwc_in_, &x_nhwc_);
  Algos& a = Prepare(ctx, layer, g, xc, wc);
  CNNFLOW_ENFORCE(y.is_contiguous() && y.dtype() == x.dtype() &&
                      y.numel() == x.dim(0) * g.out_channels * g.out_plane(),
                  layer, ": output ", y.shape(), " (", DTypeName(y.dtype()),
                  ") does not match [N, ", g.out_channels, ", ", g.out_h, ", ", g.out_w, "] in ",
                  DTypeName(x.dtype()));
  // An NCHW y of an NHWC convolution: computed NHWC, then converted.
  Tensor y_nhwc;
  if (nhwc() && !nhwc_out_) y_nhwc = Tensor::Empty(y.shape(), y.dtype(), y.device());
  Tensor& yc = y_nhwc.defined() ? y_nhwc : y;
  if (!a.fwd.found) a.fwd = FindForward(ctx, layer, xc, wc, yc);
  cudnnHandle_t h = ctx.cudnn();
  // Each batch size may have chosen another math type: set it every call
  // (a host-side field of the descriptor).
  CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_[kFwd], a.fwd.math));
  void* ws = ctx.Workspace(a.fwd.workspace);
  CNNFLOW_CUDNN_CHECK(
      cudnnConvolutionForward(h, &kCudnnOne, x_desc_, xc.raw_data(), w_desc_, wc.raw_data(),
                              conv_desc_[kFwd], static_cast<cudnnConvolutionFwdAlgo_t>(a.fwd.algo),
                              ws, a.fwd.workspace, &kCudnnZero, y_desc_, yc.raw_data()));
  if (bc != nullptr) {
    CNNFLOW_CUDNN_CHECK(cudnnAddTensor(h, &kCudnnOne, bias_desc_, bc->raw_data(), &kCudnnOne,
                                       y_desc_, yc.raw_data()));
  }
  if (y_nhwc.defined()) cuda::ChangeLayout(y_nhwc, y, /*to_nhwc=*/false);
}

void CudnnConv::Backward(const std::string& layer, const Conv2dGeometry& g, const Tensor& x,
                         const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw, Tensor* db) {
  CudaContext& ctx = CudaContext::For(x.device());
  const bool mixed = x.dtype() != w.dtype();
  // cuDNN's weight gradient goes through a scratch: half, or KRSC.
  const bool dw_scratch = mixed || nhwc();
  if (dw_scratch) {
    CNNFLOW_ENFORCE(w_compute_.defined() && w_compute_.dtype() == x.dtype() &&
                        w_compute_.device() == x.device(),
                    layer, ": backward in ", DTypeName(x.dtype()), nhwc() ? " channels-last" : "",
                    " without a forward in it (no compute copy of the weight)");
  }
  const Tensor& wc = dw_scratch ? w_compute_ : w;
  const bool convert_x = nhwc() && !nhwc_in_;
  if (convert_x) {
    CNNFLOW_ENFORCE(x_nhwc_.defined() && x_nhwc_.shape() == x.shape(), layer,
                    ": backward without a matching forward (no NHWC copy of x ", x.shape(), ")");
  }
  const Tensor& xc = convert_x ? x_nhwc_ : x;
  Algos& a = Prepare(ctx, layer, g, xc, wc);
  CNNFLOW_ENFORCE(dy.is_contiguous() && dy.dtype() == x.dtype() &&
                      dy.numel() == x.dim(0) * g.out_channels * g.out_plane(),
                  layer, ": output gradient ", dy.shape(), " (", DTypeName(dy.dtype()),
                  ") does not match [N, ", g.out_channels, ", ", g.out_h, ", ", g.out_w, "] in ",
                  DTypeName(x.dtype()));
  Tensor dy_nhwc;
  const Tensor& dyc = InComputeLayout(dy, nhwc_out_, &dy_nhwc);
  cudnnHandle_t h = ctx.cudnn();
  if (dx != nullptr) {
    CNNFLOW_ENFORCE(dx->is_contiguous() && dx->numel() == x.numel() && dx->dtype() == x.dtype(),
                    layer, ": input gradient ", dx->shape(), " (", DTypeName(dx->dtype()),
                    ") does not match the input ", x.shape(), " (", DTypeName(x.dtype()), ")");
    Tensor dx_nhwc;  // an NCHW dx: computed NHWC, then converted
    if (convert_x) dx_nhwc = Tensor::Empty(x.shape(), x.dtype(), x.device());
    Tensor& dxc = convert_x ? dx_nhwc : *dx;
    if (!a.bwd_data.found) a.bwd_data = FindBackwardData(ctx, layer, wc, dyc, dxc);
    CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_[kBwdData], a.bwd_data.math));
    void* ws = ctx.Workspace(a.bwd_data.workspace);
    std::optional<cuda::GpuSpan> span;  // --trace: the two passes apart
    if (Tracer::on()) span.emplace(x.device(), "gpu backward-data", layer);
    CNNFLOW_CUDNN_CHECK(cudnnConvolutionBackwardData(
        h, &kCudnnOne, w_desc_, wc.raw_data(), y_desc_, dyc.raw_data(), conv_desc_[kBwdData],
        static_cast<cudnnConvolutionBwdDataAlgo_t>(a.bwd_data.algo), ws, a.bwd_data.workspace,
        &kCudnnZero, x_desc_, dxc.raw_data()));
    if (convert_x) cuda::ChangeLayout(dx_nhwc, *dx, /*to_nhwc=*/false);
  }
  CNNFLOW_ENFORCE(dw.is_contiguous() && dw.numel() == w.numel() && dw.device() == x.device() &&
                      dw.dtype() == w.dtype(),
                  layer, ": weight gradient ", dw.shape(), " (", DTypeName(dw.dtype()),
                  ") does not match the weight ", w.shape(), " (", DTypeName(w.dtype()), ")");
  if (!a.bwd_filter.found) a.bwd_filter = FindBackwardFilter(ctx, layer, xc, dyc, wc);
  CNNFLOW_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_[kBwdFilter], a.bwd_filter.math));
  void* ws = ctx.Workspace(a.bwd_filter.workspace);
  // Parameter gradients accumulate (ops/layer.h): beta = 1 in f32 NCHW;
  // else cuDNN writes a scratch that is added in f32 (transposed from KRSC).
  Tensor dw_c;
  if (dw_scratch) dw_c = Tensor::Empty(w.shape(), x.dtype(), x.device());
  std::optional<cuda::GpuSpan> span;
  if (Tracer::on()) span.emplace(x.device(), "gpu backward-weights", layer);
  CNNFLOW_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
      h, &kCudnnOne, x_desc_, xc.raw_data(), y_desc_, dyc.raw_data(), conv_desc_[kBwdFilter],
      static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.bwd_filter.algo), ws, a.bwd_filter.workspace,
      dw_scratch ? &kCudnnZero : &kCudnnOne, w_desc_,
      dw_scratch ? dw_c.raw_data() : dw.raw_data()));
  if (nhwc()) {
    cuda::ChangeLayout(dw_c, dw, /*to_nhwc=*/false, /*accumulate=*/true);
  } else if (mixed) {
    cuda::AddCast(dw_c, dw);
  }
  span.reset();
  if (db != nullptr) {
    CNNFLOW_ENFORCE(db->is_contiguous() && db->numel() == g.out_channels &&
                        db->dtype() == DType::kF32 && db->device() == x.device(),
                    layer, ": bias gradient ", db->shape(), " (", DTypeName(db->dtype()),
                    ") is not ", g.out_channels, " f32 values on ", x.device().ToString());
    // Summed in f32 into the f32 gradient (see the top of the file).
    Tensor dy32 = dyc;
    if (mixed) {
      dy32 = Tensor::Empty(dyc.shape(), DType::kF32, dyc.device());
      cuda::Cast(dyc, dy32);
    }
    CNNFLOW_CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &kCudnnOne, y32_desc_, dy32.raw_data(),
                                                     &kCudnnOne, bias32_desc_, db->raw_data()));
  }
}

// conv2d / conv1d on cuDNN: the CPU class's parameters, shape rule and
// initialisation. conv1d's [N, C, L] is [N, C, 1, L] to cuDNN and its
// weight [K, C/groups, k] a [K, C/groups, 1, k] filter (same memory).
template <typename Base>
class ConvCudnn : public Base {
 public:
  // The cuDNN kernels run no ReLU epilogue: the relu stays a layer.
  bool FuseRelu() override { return false; }
  using Base::Base;

  // conv2d: cuDNN takes either side NHWC (conv1d's samples are not 4-D).
  Layer::ChannelsLast ChannelsLastSupport() const override {
    return std::is_same_v<Base, Conv2d> ? Layer::ChannelsLast::kConverts : Layer::ChannelsLast::kNo;
  }
  // Not Conv2d's: its oneDNN state is the CPU's.
  void SetChannelsLast(const std::vector<bool>& inputs, bool output) override {
    Layer::SetChannelsLast(inputs, output);
    conv_.SetLayouts(this->nhwc_input(), output);
  }

  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext&) override {
    CNNFLOW_ENFORCE(x.size() == 1 && x[0] != nullptr, Label(), " takes one input");
    const Tensor* bias = this->has_bias() ? &this->parameters()[1].value : nullptr;
    conv_.Forward(Label(), this->geometry(), *x[0], this->parameters()[0].value, bias, y);
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy,
                const std::vector<Tensor*>& dx) override {
    CNNFLOW_ENFORCE(x.size() == 1 && x[0] != nullptr, Label(), " takes one input");
    Tensor* dxp = dx.empty() ? nullptr : dx[0];
    Tensor* db = this->has_bias() ? &this->parameters()[1].grad : nullptr;
    conv_.Backward(Label(), this->geometry(), *x[0], this->parameters()[0].value, dy, dxp,
                   this->parameters()[0].grad, db);
  }

 private:
  const std::string& Label() const { return label_.Of(*this); }
  detail::LayerLabel label_;
  CudnnConv conv_;
};

using Conv2dCudnn = ConvCudnn<Conv2d>;
using Conv1dCudnn = ConvCudnn<Conv1d>;

}  // namespace

CNNFLOW_REGISTER_CUDA_LAYER(conv2d, Conv2dCudnn);
CNNFLOW_REGISTER_CUDA_LAYER(conv1d, Conv1dCudnn);

}  // namespace cnnflow
