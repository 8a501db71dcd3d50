// The conv2d layer on the CPU (ops/layers/conv2d.h): its parameters and
// shapes, its passes (Forward, Backward, and Conv2dPasses for layers that
// run a convolution's passes in other roles), bf16 and channels-last, and
// its registration. Its kernels are this folder's, parallel over the batch:
//   lowering.{h,cc}     im2col + GEMM (oneDNN's sgemm, ops/cpu/gemm.h) on one
//                       chunk of the batch: the GEMM shapes, col2im
//   onednn_conv.{h,cc}  oneDNN's convolution primitives for one chunk size
//   chunks.{h,cc}       a batch's passes chunk by chunk, and the chunk sums
//   picks.{h,cc}        which algorithm runs each pass, measured per shape
//   pick_cache.{h,cc}   the pick file, which remembers the picks
//   scratch.{h,cc}      a layer's kernel state (Conv2dScratch)
//
// The batch is cut into ForChunks chunks (a count that depends on the shape
// only); dW and dbias are summed per chunk, then over chunks in order, so
// results are bitwise the same for any thread count.
//
// f32 layers also have oneDNN's convolution primitives (ops/cpu/conv/onednn_conv.h),
// run per chunk on one thread each, like the GEMMs. `algo: auto` picks,
// separately for forward, backward-data and backward-weights, whichever runs
// a chunk of this shape faster, measured once per shape on this machine and
// remembered (ops/cpu/conv/pick_cache.h): neither wins every pass of every
// shape (oneDNN most backward-data passes, the GEMMs most backward-weights
// passes and every backward where C is tiny, as Fashion-MNIST's conv1).
// The measurements behind these choices:
// bench/results/2026-12-07-conv-notes.md.
#include "ops/layers/conv2d.h"

#include <cmath>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/cpu/conv/chunks.h"
#include "ops/cpu/conv/picks.h"
#include "ops/cpu/conv/scratch.h"
#include "ops/cpu/onednn.h"
#include "ops/random.h"

namespace cnnflow {
namespace {

// A pair parameter (`kernel: 3` or `kernel: [3, 2]`), checked to be >= lo.
std::pair<int64_t, int64_t> PairArg(const Args& args, const std::string& key, int64_t lo) {
  const std::vector<int64_t> v = args.Ints(key, 2);
  if (v[0] < lo || v[1] < lo) {
    throw ConfigError(
        StrCat("conv2d: '", key, "' must be >= ", lo, ", got [", v[0], ", ", v[1], "]"));
  }
  return {v[0], v[1]};
}

}  // namespace

Conv2d::Conv2d(const std::string& name, const Args& args) : Layer(name) {
  geom_.out_channels = args.Int("out");
  std::tie(geom_.kernel_h, geom_.kernel_w) = PairArg(args, "kernel", 1);
  std::tie(geom_.stride_h, geom_.stride_w) = PairArg(args, "stride", 1);
  std::tie(geom_.pad_h, geom_.pad_w) = PairArg(args, "pad", 0);
  std::tie(geom_.dilation_h, geom_.dilation_w) = PairArg(args, "dilation", 1);
  geom_.groups = args.Int("groups");
  has_bias_ = args.Bool("bias");
  const std::string& algo = args.String("algo");
  algo_ = algo == "gemm" ? ConvAlgo::kGemm : algo == "onednn" ? ConvAlgo::kOnednn : ConvAlgo::kAuto;
  in_arg_ = args.Int("in");
  if (geom_.out_channels < 1) {
    throw ConfigError(StrCat("conv2d: 'out' must be >= 1, got ", geom_.out_channels));
  }
  if (geom_.groups < 1)
    throw ConfigError(StrCat("conv2d: 'groups' must be >= 1, got ", geom_.groups));
  if (in_arg_ < 0) throw ConfigError(StrCat("conv2d: 'in' must be >= 0, got ", in_arg_));
}

Conv2d::~Conv2d() = default;

Shape Conv2d::Build(const std::vector<Shape>& inputs, DType dtype) {
  if (inputs.size() != 1 || inputs[0].rank() != 3) {
    throw ShapeError(StrCat("conv2d expects one [C, H, W] input, got ",
                            inputs.empty() ? std::string("none") : inputs[0].ToString()));
  }
  const Shape& s = inputs[0];
  Conv2dGeometry& g = geom_;
  g.in_channels = s[0];
  g.in_h = s[1];
  g.in_w = s[2];
  if (in_arg_ != 0 && in_arg_ != g.in_channels) {
    throw ShapeError(StrCat("conv2d expects ", in_arg_, " input channels (in: ", in_arg_, "), got ",
                            s, " with ", g.in_channels));
  }
  if (g.in_channels % g.groups != 0) {
    throw ShapeError(StrCat("conv2d: input channels ", g.in_channels,
                            " are not divisible by groups ", g.groups, " (input ", s, ")"));
  }
  if (g.out_channels % g.groups != 0) {
    throw ShapeError(StrCat("conv2d: output channels ", g.out_channels,
                            " (out) are not divisible by groups ", g.groups));
  }
  const int64_t eff_kh = g.dilation_h * (g.kernel_h - 1) + 1;
  const int64_t eff_kw = g.dilation_w * (g.kernel_w - 1) + 1;
  g.out_h = ConvOutputSize(g.in_h, g.kernel_h, g.stride_h, g.pad_h, g.dilation_h);
  g.out_w = ConvOutputSize(g.in_w, g.kernel_w, g.stride_w, g.pad_w, g.dilation_w);
  if (g.out_h <= 0 || g.out_w <= 0) {
    throw ShapeError(StrCat("conv2d: output size ", g.out_h, "x", g.out_w, " <= 0: input ", s,
                            " padded by ", g.pad_h, "x", g.pad_w, " is smaller than the ", eff_kh,
                            "x", eff_kw, " (dilated) kernel"));
  }
  scratch_ = std::make_unique<Conv2dScratch>(g);
  AddParameter("weight", {g.out_channels, g.in_per_group(), g.kernel_h, g.kernel_w}, dtype);
  if (has_bias_) AddParameter("bias", {g.out_channels}, dtype);
  return {g.out_channels, g.out_h, g.out_w};
}

void Conv2d::ResetParameters(Rng& rng) {
  // kaiming_uniform_(a=sqrt(5)) gives bound = 1/sqrt(fan_in); so does the bias.
  const double bound = 1.0 / std::sqrt(static_cast<double>(geom_.col_rows()));
  for (auto& p : parameters()) {
    for (int64_t i = 0; i < p.value.numel(); ++i) p.value.Set(i, rng.Uniform(-bound, bound));
  }
}

const char* ConvAlgoName(ConvAlgo a) {
  switch (a) {
    case ConvAlgo::kAuto:
      return "auto";
    case ConvAlgo::kGemm:
      return "gemm";
    case ConvAlgo::kOnednn:
      return "onednn";
    case ConvAlgo::kMatmul:
      return "matmul";
    case ConvAlgo::kFlipped:
      return "flipped";
  }
  return "?";
}

std::string Conv2d::KernelPickKey(int64_t n) const { return cpu::PickKey(geom_, has_bias_, n); }

Conv2dPlan Conv2d::PlanFor(int64_t n, DType dtype) {
  CNNFLOW_ENFORCE(scratch_ != nullptr, "conv2d: PlanFor before Build");
  return cpu::PlanConv(geom_, has_bias_, algo_, *scratch_, n, dtype);
}

void Conv2d::Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) {
  const Tensor& in = *x[0];
  CNNFLOW_ENFORCE(scratch_ != nullptr, "conv2d: Forward before Build");
  CNNFLOW_ENFORCE(in.is_contiguous() && y.is_contiguous(), "conv2d needs contiguous tensors");
  const int64_t n = in.dim(0);
  const Tensor& w = parameters()[0].value;
  const bool x16 = in.dtype() == DType::kBF16;  // a bf16 activation (ReadsBf16)
  CNNFLOW_ENFORCE(!x16 || ReadsBf16(0), "conv2d ", name(), ": a bf16 input it cannot read");
  const Conv2dPlan plan = PlanFor(n, w.dtype());
  DispatchFloat(w.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* bias = has_bias_ ? parameters()[1].value.data<T>() : nullptr;
    cpu::ConvForward<T>(geom_, plan, x16 ? nullptr : in.data<T>(), w.data<T>(), bias, relu_,
                        y.data<T>(), n, *scratch_, ctx.training,
                        x16 ? static_cast<const uint16_t*>(in.raw_data()) : nullptr);
  });
}

void Conv2d::Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                      const std::vector<Tensor*>& dx) {
  const Tensor& in = *x[0];
  CNNFLOW_ENFORCE(scratch_ != nullptr, "conv2d: Backward before Build");
  CNNFLOW_ENFORCE(in.is_contiguous() && dy.is_contiguous(), "conv2d needs contiguous tensors");
  const int64_t n = in.dim(0);
  const Tensor& w = parameters()[0].value;
  const bool x16 = in.dtype() == DType::kBF16;   // a bf16 activation (ReadsBf16)
  const bool dy16 = dy.dtype() == DType::kBF16;  // a bf16 gradient (ReadsBf16Grad)
  CNNFLOW_ENFORCE(!x16 || ReadsBf16(0), "conv2d ", name(), ": a bf16 input it cannot read");
  CNNFLOW_ENFORCE(!dy16 || ReadsBf16Grad(), "conv2d ", name(), ": a bf16 gradient it cannot read");
  const Conv2dPlan plan = PlanFor(n, w.dtype());
  DispatchFloat(w.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* dxp = dx.empty() || dx[0] == nullptr ? nullptr : dx[0]->data<T>();
    T* db = has_bias_ ? parameters()[1].grad.data<T>() : nullptr;
    cpu::ConvBackward<T>(geom_, plan, x16 ? nullptr : in.data<T>(), w.data<T>(),
                         relu_ ? y.data<T>() : nullptr, dy16 ? nullptr : dy.data<T>(), dxp,
                         parameters()[0].grad.data<T>(), db, n, *scratch_,
                         x16 ? static_cast<const uint16_t*>(in.raw_data()) : nullptr,
                         dy16 ? static_cast<const uint16_t*>(dy.raw_data()) : nullptr);
  });
}

Conv2dPasses::Conv2dPasses(const Conv2dGeometry& g, ConvAlgo algo)
    : geom_(g), algo_(algo), scratch_(std::make_unique<Conv2dScratch>(g)) {}

Conv2dPasses::~Conv2dPasses() = default;

void Conv2dPasses::Forward(const Tensor& x, const Tensor& w, Tensor& y) {
  CNNFLOW_ENFORCE(x.is_contiguous() && y.is_contiguous(), "conv2d passes need contiguous tensors");
  const int64_t n = x.dim(0);
  const Conv2dPlan plan = cpu::PlanConv(geom_, false, algo_, *scratch_, n, x.dtype());
  DispatchFloat(x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    cpu::ConvForward<T>(geom_, plan, x.data<T>(), w.data<T>(), nullptr, false, y.data<T>(), n,
                        *scratch_);
  });
}

void Conv2dPasses::BackwardData(const Tensor& w, const Tensor& dy, Tensor& dx) {
  CNNFLOW_ENFORCE(dy.is_contiguous() && dx.is_contiguous(),
                  "conv2d passes need contiguous tensors");
  const int64_t n = dy.dim(0);
  const Conv2dPlan plan = cpu::PlanConv(geom_, false, algo_, *scratch_, n, dy.dtype());
  DispatchFloat(dy.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    cpu::ConvBackward<T>(geom_, plan, nullptr, w.data<T>(), nullptr, dy.data<T>(), dx.data<T>(),
                         nullptr, nullptr, n, *scratch_);
  });
}

void Conv2dPasses::BackwardWeights(const Tensor& x, const Tensor& dy, Tensor& dw) {
  CNNFLOW_ENFORCE(x.is_contiguous() && dy.is_contiguous(), "conv2d passes need contiguous tensors");
  const int64_t n = x.dim(0);
  const Conv2dPlan plan = cpu::PlanConv(geom_, false, algo_, *scratch_, n, x.dtype());
  DispatchFloat(x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    // w is read only by the backward-data half, which is skipped (dx null).
    cpu::ConvBackward<T>(geom_, plan, x.data<T>(), nullptr, nullptr, dy.data<T>(), nullptr,
                         dw.data<T>(), nullptr, n, *scratch_);
  });
}

bool Conv2d::ComputeInBf16() {
  CNNFLOW_ENFORCE(scratch_ != nullptr, "conv2d: ComputeInBf16 before Build");
  std::lock_guard<std::mutex> lock(scratch_->mu);
  scratch_->bf16 = true;
  scratch_->plans.clear();
  scratch_->onednn.clear();
  return true;
}

Layer::ChannelsLast Conv2d::ChannelsLastSupport() const {
  if (scratch_ == nullptr) return ChannelsLast::kNo;
  // f32: oneDNN's primitives only (our GEMM lowering reads NCHW), where
  // they take channels-last tensors as they are.
  return scratch_->bf16 || (algo_ != ConvAlgo::kGemm && cpu::OnednnHasAvx512Core())
             ? ChannelsLast::kConverts
             : ChannelsLast::kNo;
}

bool Conv2d::ReadsBf16(size_t input) const {
  return input == 0 && scratch_ != nullptr && scratch_->bf16 && nhwc_input(0);
}

bool Conv2d::ReadsBf16Grad() const {
  return scratch_ != nullptr && scratch_->bf16 && nhwc_output() && !relu_;
}

void Conv2d::SetChannelsLast(const std::vector<bool>& inputs, bool output) {
  CNNFLOW_ENFORCE(ChannelsLastSupport() == ChannelsLast::kConverts,
                  "conv2d: channels-last tensors where its kernels read NCHW only");
  Layer::SetChannelsLast(inputs, output);
  std::lock_guard<std::mutex> lock(scratch_->mu);
  scratch_->nhwc_in = nhwc_input();
  scratch_->nhwc_out = output;
  scratch_->plans.clear();
  scratch_->onednn.clear();
}

int64_t Conv2d::ForwardFlops(int64_t n) const {
  return 2 * n * geom_.out_channels * geom_.col_rows() * geom_.out_plane();
}

CNNFLOW_REGISTER_LAYER(
    conv2d, Conv2d,
    Schema("2D convolution [C, H, W] -> [K, H', W'] (PyTorch's Conv2d: weight [K, C/groups, "
           "kh, kw], bias [K]); H' = (H + 2*pad - dilation*(kernel-1) - 1) / stride + 1")
        .Required("out", ParamType::kInt, "output channels K")
        .Required("kernel", ParamType::kIntList, "kernel size: k or [kh, kw]")
        .Optional("stride", ParamType::kIntList, int64_t{1}, "stride: s or [sh, sw]")
        .Optional("pad", ParamType::kIntList, int64_t{0},
                  "zero padding on each side: p or [ph, pw]")
        .Optional("dilation", ParamType::kIntList, int64_t{1}, "kernel dilation: d or [dh, dw]")
        .Optional("groups", ParamType::kInt, int64_t{1},
                  "channel groups; C and K must be divisible by it")
        .Optional("bias", ParamType::kBool, true, "learn an additive bias per output channel")
        .Optional("in", ParamType::kInt, int64_t{0},
                  "input channels C, checked against the input (0: inferred)")
        .Choice("algo", {"auto", "gemm", "onednn"}, "auto",
                "CPU kernels: im2col + GEMM, oneDNN's primitives (f32), or auto: the faster "
                "of the two per pass, measured once per shape on this machine"));

}  // namespace cnnflow
