// conv1d on the CPU: per-tap shifted GEMMs for stride 1, otherwise
// conv2d's kernels on [N, C, 1, L] with a 1 x k kernel.
//
// Shifted GEMMs (stride 1; per sample and group g, Kg = K/groups, Cg =
// C/groups, tap j reading input o + shift_j for output o in [lo_j, hi_j)):
//   forward   Y_g[:, lo:hi]       += W_gj[Kg, Cg] * X_g[:, lo+shift : hi+shift]
//   backward  dW_gj[Kg, Cg]       += dY_g[:, lo:hi] * X_g[:, lo+shift : hi+shift]^T
//             dX_g[:, lo+shift:..] += W_gj^T[Cg, Kg] * dY_g[:, lo:hi]
// where W_gj is the weight of tap j repacked to a [Kg, Cg] matrix. A
// column range of a row-major [Cg, L] matrix is itself a matrix (leading
// dimension L), so no im2col / col2im copies are needed: faster than
// im2col + one GEMM, backward most (it skips both im2col and col2im;
// figures: bench/results/2026-12-07-cpu-kernel-measurements.md). With few
// input channels the per-tap GEMMs get too thin (inner dimension Cg), so
// Cg < 8 or stride > 1 take conv2d's im2col lowering instead, where H = 1
// reduces it to exactly the 1D lowering (one col row per channel and tap).
//
// dW and dbias are summed per ForChunks chunk of the batch and then over
// chunks in order, as in conv2d: bitwise the same for any thread count.
//
// A pass that conv2d's plan (`algo`, ops/cpu/conv/picks.h) gives to oneDNN
// runs as conv2d on [N, C, 1, L]; so does backward when either of its passes
// is oneDNN's. (auto measures oneDNN against im2col + GEMM, not against the
// shifted GEMMs, which are faster than im2col: it leans to oneDNN.)
#include "ops/layers/conv1d.h"

#include <algorithm>
#include <string>
#include <vector>

#include "ops/cpu/elementwise.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/parallel.h"

namespace cnnflow {
namespace {

using Tap = Conv1d::Tap;

// The shifted-GEMM lowering pays off once each per-tap GEMM has this many
// input channels (its inner dimension).
constexpr int64_t kMinShiftedChannels = 8;

// A tap that covers the whole output row (forward) or, with `input` set,
// whose outputs cover the whole input row (dx): its GEMM can overwrite
// instead of accumulate, saving a zero fill. -1 if none.
int64_t FullTap(const std::vector<Tap>& taps, int64_t out_len, int64_t in_len, bool input) {
  for (size_t j = 0; j < taps.size(); ++j) {
    const Tap& t = taps[j];
    const bool full =
        input ? t.lo + t.shift == 0 && t.hi + t.shift == in_len : t.lo == 0 && t.hi == out_len;
    if (full) return static_cast<int64_t>(j);
  }
  return -1;
}

// The taps in GEMM order: the full tap (if any) first.
std::vector<int64_t> TapOrder(int64_t taps, int64_t full) {
  std::vector<int64_t> order;
  if (full >= 0) order.push_back(full);
  for (int64_t j = 0; j < taps; ++j) {
    if (j != full) order.push_back(j);
  }
  return order;
}

// w [K, Cg, k] -> wt [groups, k, Kg, Cg]: tap j of group g as a matrix.
template <typename T>
void RepackWeights(const Conv2dGeometry& g, const T* w, T* wt) {
  const int64_t k = g.kernel_w, kg = g.out_per_group(), cg = g.in_per_group();
  for (int64_t o = 0; o < g.out_channels; ++o) {
    const int64_t grp = o / kg, ko = o % kg;
    for (int64_t c = 0; c < cg; ++c) {
      for (int64_t j = 0; j < k; ++j)
        wt[((grp * k + j) * kg + ko) * cg + c] = w[(o * cg + c) * k + j];
    }
  }
}

// x [n, C, L], w [K, Cg, k], bias [K] or null -> y [n, K, L'].
template <typename T>
void ShiftedForward(const Conv2dGeometry& g, const std::vector<Tap>& taps, const T* x, const T* w,
                    const T* bias, T* y, int64_t n) {
  const int64_t len = g.in_w, out_len = g.out_w, kg = g.out_per_group(), cg = g.in_per_group();
  const int64_t k = g.kernel_w;
  Tensor wt_t = Tensor::Empty({g.out_channels * cg * k}, DTypeOf<T>());
  T* wt = wt_t.data<T>();
  RepackWeights(g, w, wt);
  // Without bias a tap spanning the whole row writes Y first (beta 0).
  const int64_t full = bias == nullptr ? FullTap(taps, out_len, len, false) : -1;
  const std::vector<int64_t> order = TapOrder(k, full);
  cpu::ParallelFor(n * g.groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t sg = begin; sg < end; ++sg) {  // sample * groups + group
      const int64_t grp = sg % g.groups;
      const T* xg = x + sg * cg * len;
      T* yg = y + sg * kg * out_len;
      if (bias != nullptr) {
        for (int64_t o = 0; o < kg; ++o) std::fill_n(yg + o * out_len, out_len, bias[grp * kg + o]);
      } else if (full < 0) {
        std::fill_n(yg, kg * out_len, T(0));
      }
      for (int64_t j : order) {
        const Tap& t = taps[j];
        if (t.hi <= t.lo) continue;
        cpu::Gemm<T>(false, false, kg, t.hi - t.lo, cg, T(1), wt + (grp * k + j) * kg * cg, cg,
                     xg + t.lo + t.shift, len, j == full ? T(0) : T(1), yg + t.lo, out_len);
      }
    }
  });
}

// x [n, C, L], w [K, Cg, k], dy [n, K, L'] -> dx [n, C, L] (overwritten;
// null: skipped), dw [K, Cg, k] and db [K] (added into; db null: no bias).
template <typename T>
void ShiftedBackward(const Conv2dGeometry& g, const std::vector<Tap>& taps, const T* x, const T* w,
                     const T* dy, T* dx, T* dw, T* db, int64_t n) {
  if (n == 0) return;
  const int64_t len = g.in_w, out_len = g.out_w, kg = g.out_per_group(), cg = g.in_per_group();
  const int64_t k = g.kernel_w;
  const int64_t dw_size = g.out_channels * cg * k;
  const int64_t part_size = dw_size + g.out_channels;  // dW (repacked layout), then dbias
  const int64_t chunks = cpu::NumChunks(n, 1);         // a function of n only
  Tensor wt_t = Tensor::Empty({dw_size}, DTypeOf<T>());
  T* wt = wt_t.data<T>();
  RepackWeights(g, w, wt);
  Tensor partial_t = Tensor::Empty({chunks * part_size}, DTypeOf<T>());
  T* partial = partial_t.data<T>();
  const int64_t full = FullTap(taps, out_len, len, true);
  const std::vector<int64_t> order = TapOrder(k, full);

  cpu::ForChunks(n, chunks, [&](int64_t chunk, int64_t begin, int64_t end) {
    T* pdw = partial + chunk * part_size;
    T* pdb = pdw + dw_size;
    std::fill_n(pdw, part_size, T(0));
    for (int64_t s = begin; s < end; ++s) {
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const int64_t sg = s * g.groups + grp;
        const T* xg = x + sg * cg * len;
        const T* dyg = dy + sg * kg * out_len;
        for (int64_t j = 0; j < k; ++j) {
          const Tap& t = taps[j];
          if (t.hi <= t.lo) continue;
          cpu::Gemm<T>(false, true, kg, cg, t.hi - t.lo, T(1), dyg + t.lo, out_len,
                       xg + t.lo + t.shift, len, T(1), pdw + (grp * k + j) * kg * cg, cg);
        }
        if (dx == nullptr) continue;
        T* dxg = dx + sg * cg * len;
        if (full < 0) std::fill_n(dxg, cg * len, T(0));
        for (int64_t j : order) {
          const Tap& t = taps[j];
          if (t.hi <= t.lo) continue;
          cpu::Gemm<T>(true, false, cg, t.hi - t.lo, kg, T(1), wt + (grp * k + j) * kg * cg, cg,
                       dyg + t.lo, out_len, j == full ? T(0) : T(1), dxg + t.lo + t.shift, len);
        }
      }
      if (db != nullptr) {
        const T* dys = dy + s * g.out_channels * out_len;
        for (int64_t o = 0; o < g.out_channels; ++o) pdb[o] += RowSum(dys + o * out_len, out_len);
      }
    }
  });

  // Partial sums in chunk order, back to PyTorch's layout, into the grads.
  const int64_t total = db != nullptr ? part_size : dw_size;
  cpu::ParallelFor(total, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int64_t p = i;  // where element i of dW [K, Cg, k] (or dbias) sits in a partial buffer
      if (i < dw_size) {
        const int64_t o = i / (cg * k), c = i / k % cg, j = i % k;
        p = ((o / kg * k + j) * kg + o % kg) * cg + c;
      }
      T sum = partial[p];
      for (int64_t c = 1; c < chunks; ++c) sum += partial[c * part_size + p];
      if (i < dw_size) {
        dw[i] += sum;
      } else {
        db[i - dw_size] += sum;
      }
    }
  });
}

// One int of a 1D parameter (`kernel: 3` or `kernel: [3]`), checked >= lo.
int64_t IntArg(const Args& args, const std::string& key, int64_t lo) {
  const int64_t v = args.Ints(key, 1)[0];
  if (v < lo) throw ConfigError(StrCat("conv1d: '", key, "' must be >= ", lo, ", got ", v));
  return v;
}

// conv1d's arguments as conv2d's: a 1 x k kernel over a [C, 1, L] input.
Args To2dArgs(const Args& args) {
  Args a = args;
  a.Set("kernel", std::vector<int64_t>{1, IntArg(args, "kernel", 1)});
  a.Set("stride", std::vector<int64_t>{1, IntArg(args, "stride", 1)});
  a.Set("pad", std::vector<int64_t>{0, IntArg(args, "pad", 0)});
  a.Set("dilation", std::vector<int64_t>{1, IntArg(args, "dilation", 1)});
  const int64_t out = args.Int("out"), groups = args.Int("groups"), in = args.Int("in");
  if (out < 1) throw ConfigError(StrCat("conv1d: 'out' must be >= 1, got ", out));
  if (groups < 1) throw ConfigError(StrCat("conv1d: 'groups' must be >= 1, got ", groups));
  if (in < 0) throw ConfigError(StrCat("conv1d: 'in' must be >= 0, got ", in));
  return a;
}

// [N, C, L] -> [N, C, 1, L] (a view).
Tensor As2d(const Tensor& t) {
  CNNFLOW_ENFORCE(t.rank() == 3, "conv1d expects [N, C, L] tensors, got ", t.shape());
  return t.Reshape({t.dim(0), t.dim(1), 1, t.dim(2)});
}

}  // namespace

Conv1d::Conv1d(const std::string& name, const Args& args)
    : Conv2d(name, To2dArgs(args)), in_arg_(args.Int("in")) {}

Shape Conv1d::Build(const std::vector<Shape>& inputs, DType dtype) {
  if (inputs.size() != 1 || inputs[0].rank() != 2) {
    throw ShapeError(StrCat("conv1d expects one [C, L] input, got ",
                            inputs.empty() ? std::string("none") : inputs[0].ToString()));
  }
  // The same checks as conv2d's, worded for [C, L], before conv2d sees it.
  const Shape& s = inputs[0];
  const Conv2dGeometry& g = geometry();
  const int64_t c = s[0], len = s[1];
  if (in_arg_ != 0 && in_arg_ != c) {
    throw ShapeError(StrCat("conv1d expects ", in_arg_, " input channels (in: ", in_arg_, "), got ",
                            s, " with ", c));
  }
  if (c % g.groups != 0) {
    throw ShapeError(StrCat("conv1d: input channels ", c, " are not divisible by groups ", g.groups,
                            " (input ", s, ")"));
  }
  if (g.out_channels % g.groups != 0) {
    throw ShapeError(StrCat("conv1d: output channels ", g.out_channels,
                            " (out) are not divisible by groups ", g.groups));
  }
  const int64_t out_len = ConvOutputSize(len, g.kernel_w, g.stride_w, g.pad_w, g.dilation_w);
  if (out_len <= 0) {
    throw ShapeError(StrCat("conv1d: output length ", out_len, " <= 0: input ", s, " padded by ",
                            g.pad_w, " on each side is shorter than the ",
                            g.dilation_w * (g.kernel_w - 1) + 1, "-long (dilated) kernel"));
  }
  const Shape out = Conv2d::Build({Shape({c, 1, len})}, dtype);
  // PyTorch's layout: weight [K, C/groups, k]; the kernels only see pointers.
  Parameter& w = parameters()[0];
  const Shape w3({g.out_channels, g.in_per_group(), g.kernel_w});
  w.value = w.value.Reshape(w3);
  w.grad = w.grad.Reshape(w3);

  shifted_ = g.stride_w == 1 && g.in_per_group() >= kMinShiftedChannels;
  taps_.clear();
  for (int64_t j = 0; j < g.kernel_w; ++j) {
    Tap t;
    t.shift = j * g.dilation_w - g.pad_w;
    t.lo = std::clamp<int64_t>(-t.shift, 0, g.out_w);
    t.hi = std::clamp<int64_t>(len - t.shift, t.lo, g.out_w);
    taps_.push_back(t);
  }
  return {out[0], out[2]};
}

void Conv1d::Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) {
  const Tensor& in = *x[0];
  if (!shifted_ || PlanFor(in.dim(0), in.dtype()).forward == ConvAlgo::kOnednn) {
    const Tensor x2 = As2d(in);
    Tensor y2 = As2d(y);
    Conv2d::Forward({&x2}, y2, ctx);
    return;
  }
  CNNFLOW_ENFORCE(in.rank() == 3 && in.is_contiguous() && y.is_contiguous(),
                  "conv1d needs contiguous [N, C, L] tensors, got ", in.shape());
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* bias = has_bias() ? parameters()[1].value.data<T>() : nullptr;
    ShiftedForward<T>(geometry(), taps_, in.data<T>(), parameters()[0].value.data<T>(), bias,
                      y.data<T>(), in.dim(0));
  });
}

void Conv1d::Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                      const std::vector<Tensor*>& dx) {
  const Tensor& in = *x[0];
  Tensor* dx0 = dx.empty() ? nullptr : dx[0];
  const Conv2dPlan plan = PlanFor(in.dim(0), in.dtype());
  if (!shifted_ || plan.backward_data != ConvAlgo::kGemm ||
      plan.backward_weights != ConvAlgo::kGemm) {
    const Tensor x2 = As2d(in), y2 = As2d(y), dy2 = As2d(dy);
    Tensor dx2;
    if (dx0 != nullptr) dx2 = As2d(*dx0);
    Conv2d::Backward({&x2}, y2, dy2, {dx0 != nullptr ? &dx2 : nullptr});
    return;
  }
  CNNFLOW_ENFORCE(in.rank() == 3 && in.is_contiguous() && dy.is_contiguous(),
                  "conv1d needs contiguous [N, C, L] tensors, got ", in.shape());
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* dxp = dx0 != nullptr ? dx0->data<T>() : nullptr;
    T* db = has_bias() ? parameters()[1].grad.data<T>() : nullptr;
    ShiftedBackward<T>(geometry(), taps_, in.data<T>(), parameters()[0].value.data<T>(),
                       dy.data<T>(), dxp, parameters()[0].grad.data<T>(), db, in.dim(0));
  });
}

CNNFLOW_REGISTER_LAYER(
    conv1d, Conv1d,
    Schema("1D convolution [C, L] -> [K, L'] (PyTorch's Conv1d: weight [K, C/groups, k], "
           "bias [K]); L' = (L + 2*pad - dilation*(kernel-1) - 1) / stride + 1")
        .Required("out", ParamType::kInt, "output channels K")
        .Required("kernel", ParamType::kIntList, "kernel size k")
        .Optional("stride", ParamType::kIntList, int64_t{1}, "stride")
        .Optional("pad", ParamType::kIntList, int64_t{0}, "zero padding on each side")
        .Optional("dilation", ParamType::kIntList, int64_t{1}, "kernel dilation")
        .Optional("groups", ParamType::kInt, int64_t{1},
                  "channel groups; C and K must be divisible by it")
        .Optional("bias", ParamType::kBool, true, "learn an additive bias per output channel")
        .Optional("in", ParamType::kInt, int64_t{0},
                  "input channels C, checked against the input (0: inferred)")
        .Choice("algo", {"auto", "gemm", "onednn"}, "auto",
                "CPU kernels: GEMMs (shifted per tap, or im2col), oneDNN's primitives (f32), or "
                "auto: per pass the faster of oneDNN and im2col + GEMM, measured once per shape "
                "on this machine"));

}  // namespace cnnflow
