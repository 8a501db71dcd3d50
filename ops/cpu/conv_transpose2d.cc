// CPU kernels of conv_transpose2d: conv2d's passes on the dual convolution
// (ops/layers/conv_transpose2d.h), plus the bias.
//   forward           Y[n, K, H', W'] = dual.BackwardData(W, X) + bias
//   backward-data     dX[n, C, H, W]  = dual.Forward(dY, W)
//   backward-weights  dW[C, K/g, kh, kw] += dual.BackwardWeights(dY, X)
//   bias              db[k] += sum over n, H', W' of dY
// Why conv2d's passes and not oneDNN's deconvolution primitives: they are
// the same computation (oneDNN runs its deconvolutions as convolution
// backward-data), and going through Conv2dPasses brings conv2d's tuned
// im2col/col2im, its per-shape GEMM-or-oneDNN pick, its deterministic
// chunked weight-gradient sum and its f64 path, with no second copy of any.
#include "ops/layers/conv_transpose2d.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "ops/cpu/elementwise.h"
#include "ops/cpu/parallel.h"

namespace cnnflow {
namespace {

// `key: v` or `key: [vh, vw]`, each >= lo, or a ConfigError naming the layer.
std::pair<int64_t, int64_t> Pair(const std::string& layer, const Args& args, const std::string& key,
                                 int64_t lo) {
  const std::vector<int64_t> v = args.Ints(key, 2);
  if (v[0] < lo || v[1] < lo) {
    throw ConfigError(StrCat("conv_transpose2d '", layer, "': '", key, "' must be >= ", lo,
                             ", got [", v[0], ", ", v[1], "]"));
  }
  return {v[0], v[1]};
}

}  // namespace

ConvTranspose2d::ConvTranspose2d(const std::string& name, const Args& args) : Layer(name) {
  Conv2dGeometry& g = dual_;
  g.in_channels = args.Int("out");
  std::tie(g.kernel_h, g.kernel_w) = Pair(name, args, "kernel", 1);
  std::tie(g.stride_h, g.stride_w) = Pair(name, args, "stride", 1);
  std::tie(g.pad_h, g.pad_w) = Pair(name, args, "pad", 0);
  std::tie(g.dilation_h, g.dilation_w) = Pair(name, args, "dilation", 1);
  std::tie(output_pad_h_, output_pad_w_) = Pair(name, args, "output_pad", 0);
  g.groups = args.Int("groups");
  has_bias_ = args.Bool("bias");
  const std::string& algo = args.String("algo");
  algo_ = algo == "gemm" ? ConvAlgo::kGemm : algo == "onednn" ? ConvAlgo::kOnednn : ConvAlgo::kAuto;
  if (g.in_channels < 1) {
    throw ConfigError(
        StrCat("conv_transpose2d '", name, "': 'out' must be >= 1, got ", g.in_channels));
  }
  if (g.groups < 1) {
    throw ConfigError(
        StrCat("conv_transpose2d '", name, "': 'groups' must be >= 1, got ", g.groups));
  }
  // PyTorch's rule: output padding below the stride or the dilation.
  if ((output_pad_h_ >= g.stride_h && output_pad_h_ >= g.dilation_h) ||
      (output_pad_w_ >= g.stride_w && output_pad_w_ >= g.dilation_w)) {
    throw ConfigError(StrCat("conv_transpose2d '", name, "': output_pad [", output_pad_h_, ", ",
                             output_pad_w_, "] must be smaller than the stride [", g.stride_h, ", ",
                             g.stride_w, "] or the dilation [", g.dilation_h, ", ", g.dilation_w,
                             "]"));
  }
}

ConvTranspose2d::~ConvTranspose2d() = default;

Shape ConvTranspose2d::Build(const std::vector<Shape>& inputs, DType dtype) {
  if (inputs.size() != 1 || inputs[0].rank() != 3) {
    throw ShapeError(StrCat("conv_transpose2d '", name(), "' expects one [C, H, W] input, got ",
                            inputs.empty() ? std::string("none") : inputs[0].ToString()));
  }
  const Shape& s = inputs[0];
  Conv2dGeometry& g = dual_;
  g.out_channels = s[0];
  g.out_h = s[1];
  g.out_w = s[2];
  if (g.out_channels % g.groups != 0 || g.in_channels % g.groups != 0) {
    throw ShapeError(StrCat("conv_transpose2d '", name(), "': input channels ", g.out_channels,
                            " (input ", s, ") and output channels ", g.in_channels,
                            " must both be divisible by groups ", g.groups));
  }
  g.in_h = (g.out_h - 1) * g.stride_h - 2 * g.pad_h + g.dilation_h * (g.kernel_h - 1) +
           output_pad_h_ + 1;
  g.in_w = (g.out_w - 1) * g.stride_w - 2 * g.pad_w + g.dilation_w * (g.kernel_w - 1) +
           output_pad_w_ + 1;
  if (g.in_h <= 0 || g.in_w <= 0) {
    throw ShapeError(StrCat("conv_transpose2d '", name(), "': output size ", g.in_h, "x", g.in_w,
                            " <= 0 for input ", s, " (pad ", g.pad_h, "x", g.pad_w, ")"));
  }
  // With output_pad >= stride (allowed when below the dilation) the dual's
  // floor rule gives more than H rows; its extra rows would read the
  // padding only, so the GEMM kernels run with out_h = H as set above, and
  // oneDNN (which checks the rule) is not asked.
  const bool exact =
      ConvOutputSize(g.in_h, g.kernel_h, g.stride_h, g.pad_h, g.dilation_h) == g.out_h &&
      ConvOutputSize(g.in_w, g.kernel_w, g.stride_w, g.pad_w, g.dilation_w) == g.out_w;
  passes_ = std::make_unique<Conv2dPasses>(g, exact ? algo_ : ConvAlgo::kGemm);
  AddParameter("weight", {g.out_channels, g.in_per_group(), g.kernel_h, g.kernel_w}, dtype);
  if (has_bias_) AddParameter("bias", {g.in_channels}, dtype);
  return {g.in_channels, g.in_h, g.in_w};
}

void ConvTranspose2d::ResetParameters(Rng& rng) {
  // kaiming_uniform_(a=sqrt(5)): bound 1/sqrt(fan_in), fan_in = weight.size(1)*kh*kw.
  const double bound = 1.0 / std::sqrt(static_cast<double>(dual_.col_rows()));
  for (auto& p : parameters()) {
    for (int64_t i = 0; i < p.value.numel(); ++i) p.value.Set(i, rng.Uniform(-bound, bound));
  }
}

void ConvTranspose2d::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                              const ForwardContext&) {
  CNNFLOW_ENFORCE(passes_ != nullptr, "conv_transpose2d '", name(), "': Forward before Build");
  const Tensor& in = *x[0];
  const int64_t n = in.dim(0);
  CNNFLOW_ENFORCE(in.numel() == n * dual_.out_channels * dual_.out_plane() &&
                      y.numel() == n * dual_.in_channels * dual_.in_plane(),
                  "conv_transpose2d '", name(), "': ", in.shape(), " -> ", y.shape());
  passes_->BackwardData(parameters()[0].value, in, y);
  if (!has_bias_) return;
  const int64_t plane = dual_.in_plane(), k_n = dual_.in_channels;
  DispatchFloat(y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* b = parameters()[1].value.data<T>();
    T* ys = y.data<T>();
    cpu::ParallelFor(n * k_n, std::max<int64_t>(1, (1 << 14) / plane), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T v = b[r % k_n];
        T* row = ys + r * plane;
        for (int64_t i = 0; i < plane; ++i) row[i] += v;
      }
    });
  });
}

void ConvTranspose2d::Backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy,
                               const std::vector<Tensor*>& dx) {
  CNNFLOW_ENFORCE(passes_ != nullptr, "conv_transpose2d '", name(), "': Backward before Build");
  const Tensor& in = *x[0];
  if (!dx.empty() && dx[0] != nullptr) passes_->Forward(dy, parameters()[0].value, *dx[0]);
  passes_->BackwardWeights(dy, in, parameters()[0].grad);
  if (!has_bias_) return;
  const int64_t n = dy.dim(0), plane = dual_.in_plane(), k_n = dual_.in_channels;
  DispatchFloat(dy.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* g = dy.data<T>();
    T* db = parameters()[1].grad.data<T>();
    // One task per channel, samples in order: the same sum for any thread count.
    cpu::ParallelFor(k_n, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t k = lo; k < hi; ++k) {
        T s = 0;
        for (int64_t i = 0; i < n; ++i) s += RowSum(g + (i * k_n + k) * plane, plane);
        db[k] += s;
      }
    });
  });
}

int64_t ConvTranspose2d::ForwardFlops(int64_t n) const {
  return 2 * n * dual_.out_channels * dual_.col_rows() * dual_.out_plane();
}

CNNFLOW_REGISTER_LAYER(
    conv_transpose2d, ConvTranspose2d,
    Schema("Transposed 2D convolution [C, H, W] -> [K, H', W'] (torch.nn.ConvTranspose2d: weight "
           "[C, K/groups, kh, kw], bias [K]); H' = (H-1)*stride - 2*pad + dilation*(kernel-1) + "
           "output_pad + 1")
        .Required("out", ParamType::kInt, "output channels K")
        .Required("kernel", ParamType::kIntList, "kernel size: k or [kh, kw]")
        .Optional("stride", ParamType::kIntList, int64_t{1}, "stride: s or [sh, sw]")
        .Optional("pad", ParamType::kIntList, int64_t{0},
                  "padding removed from each side of the output: p or [ph, pw]")
        .Optional("output_pad", ParamType::kIntList, int64_t{0},
                  "extra rows/columns on the bottom/right of the output; below the stride or "
                  "the dilation")
        .Optional("dilation", ParamType::kIntList, int64_t{1}, "kernel dilation: d or [dh, dw]")
        .Optional("groups", ParamType::kInt, int64_t{1},
                  "channel groups; C and K must be divisible by it")
        .Optional("bias", ParamType::kBool, true, "learn an additive bias per output channel")
        .Choice("algo", {"auto", "gemm", "onednn"}, "auto",
                "CPU kernels (those of the dual convolution): im2col + GEMM, oneDNN's "
                "primitives (f32), or auto: the faster per pass, measured once per shape"));

}  // namespace cnnflow
