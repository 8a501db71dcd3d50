// The activation layers on the CPU (ops/layers/activation.h) and the
// registration of every activation type.
//
// f32 gelu, silu, sigmoid and tanh run as oneDNN eltwise primitives (its JIT
// polynomial exp/erf/tanh, AVX2 or AVX-512), not as libm calls, which are
// several times slower (bench/kernels_bench.cc BM_Gelu, BM_GeluScalarLoop;
// figures: bench/results/2026-12-07-cpu-kernel-measurements.md).
// As in ops/cpu/conv/onednn_conv.cc, TBB owns the threads: the
// tensor is cut into chunks of a fixed length, each run by one primitive
// call on one OpenMP thread, so the result is the same for any thread count.
// The piecewise-linear ones are plain loops gcc vectorises; f64 (gradient
// checks) is the scalar reference path of the same functions.
#include "ops/layers/activation.h"

#include <dnnl.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "ops/cpu/onednn.h"
#include "ops/cpu/parallel.h"

namespace cnnflow {
namespace {

// Elements per parallel task of the loops, and per oneDNN call: large enough
// that scheduling and the call are noise, small enough to stay in L2.
constexpr int64_t kGrain = int64_t{1} << 15;

struct ActivationInfo {
  Activation kind;
  const char* type;  // the YAML type
  // The oneDNN eltwise algorithm of the f32 path (undef: the plain loop) and
  // its alpha (swish's x * sigmoid(alpha x)).
  dnnl::algorithm onednn;
  float onednn_alpha;
};

// Indexed by Activation.
constexpr ActivationInfo kActivations[] = {
    {Activation::kGeluErf, "gelu", dnnl::algorithm::eltwise_gelu_erf, 0.f},
    {Activation::kGeluTanh, "gelu", dnnl::algorithm::eltwise_gelu_tanh, 0.f},
    {Activation::kSilu, "silu", dnnl::algorithm::eltwise_swish, 1.f},
    {Activation::kSigmoid, "sigmoid", dnnl::algorithm::eltwise_logistic, 0.f},
    {Activation::kTanh, "tanh", dnnl::algorithm::eltwise_tanh, 0.f},
    {Activation::kHardsigmoid, "hardsigmoid", dnnl::algorithm::undef, 0.f},
    {Activation::kHardswish, "hardswish", dnnl::algorithm::undef, 0.f},
    {Activation::kRelu6, "relu6", dnnl::algorithm::undef, 0.f},
    {Activation::kLeakyRelu, "leaky_relu", dnnl::algorithm::undef, 0.f},
};

const ActivationInfo& Info(Activation k) {
  const ActivationInfo& info = kActivations[static_cast<int>(k)];
  CNNFLOW_ENFORCE(info.kind == k, "activation table out of order");
  return info;
}

// --- oneDNN eltwise over chunks ---------------------------------------------

using dnnl::memory;

using cpu::OnednnEngine;

// The forward and backward primitives of one algorithm on `len` contiguous
// f32 values; execute from any number of threads at once (user scratchpad).
class Eltwise {
 public:
  Eltwise(dnnl::algorithm alg, float alpha, int64_t len)
      : md_({len}, memory::data_type::f32, memory::format_tag::a) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    using Fwd = dnnl::eltwise_forward;
    using Bwd = dnnl::eltwise_backward;
    const Fwd::primitive_desc fwd_pd(
        Fwd::desc(dnnl::prop_kind::forward_training, alg, md_, alpha, 0.f), attr, OnednnEngine());
    const Bwd::primitive_desc bwd_pd(Bwd::desc(alg, md_, md_, alpha, 0.f), attr, OnednnEngine(),
                                     fwd_pd);
    fwd_ = Fwd(fwd_pd);
    bwd_ = Bwd(bwd_pd);
    fwd_pad_ = fwd_pd.scratchpad_desc();
    bwd_pad_ = bwd_pd.scratchpad_desc();
  }

  void Forward(const float* x, float* y) const {
    Run(fwd_, fwd_pad_, {{DNNL_ARG_SRC, Mem(x)}, {DNNL_ARG_DST, Mem(y)}});
  }
  // dx = dy * f'(x).
  void Backward(const float* x, const float* dy, float* dx) const {
    Run(bwd_, bwd_pad_,
        {{DNNL_ARG_SRC, Mem(x)}, {DNNL_ARG_DIFF_DST, Mem(dy)}, {DNNL_ARG_DIFF_SRC, Mem(dx)}});
  }

 private:
  memory Mem(const float* p) const { return memory(md_, OnednnEngine(), const_cast<float*>(p)); }

  static void Run(const dnnl::primitive& prim, const memory::desc& pad,
                  std::unordered_map<int, memory> args) {
    cpu::OneOpenMpThreadHere();
    thread_local std::vector<float> scratch;
    if (pad.get_size() > 0) {
      if (scratch.size() * sizeof(float) < pad.get_size()) scratch.resize(pad.get_size() / 4 + 1);
      args.emplace(DNNL_ARG_SCRATCHPAD, memory(pad, OnednnEngine(), scratch.data()));
    }
    prim.execute(cpu::OnednnStream(), args);
  }

  memory::desc md_;
  dnnl::eltwise_forward fwd_;
  dnnl::eltwise_backward bwd_;
  memory::desc fwd_pad_, bwd_pad_;
};

// The primitives for (algorithm, length), made once and kept: a model has a
// few activation shapes, and each tensor needs two lengths (kGrain, tail).
const Eltwise& EltwiseFor(const ActivationInfo& info, int64_t len) {
  static std::mutex mu;
  static auto* cache = new std::map<std::pair<int, int64_t>, std::unique_ptr<Eltwise>>();
  const std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<Eltwise>& e = (*cache)[{static_cast<int>(info.kind), len}];
  if (!e) {
    // oneDNN sizes a primitive's OpenMP team when it creates it.
    cpu::OneOpenMpThreadHere();
    try {
      e = std::make_unique<Eltwise>(info.onednn, info.onednn_alpha, len);
    } catch (const dnnl::error& err) {
      throw Error(StrCat("oneDNN has no eltwise primitive for ", info.type, " on ", len,
                         " values: ", err.what()));
    }
  }
  return *e;
}

// fn(eltwise, begin) for each kGrain-long chunk of [0, n) (the last may be
// shorter), in parallel.
template <typename Fn>
void ForOnednnChunks(const ActivationInfo& info, int64_t n, Fn&& fn) {
  if (n == 0) return;
  const int64_t chunks = (n + kGrain - 1) / kGrain;
  const Eltwise& full = EltwiseFor(info, std::min(n, kGrain));
  const Eltwise& tail = n > kGrain && n % kGrain != 0 ? EltwiseFor(info, n % kGrain) : full;
  cpu::ForChunks(chunks, chunks, [&](int64_t c, int64_t, int64_t) {
    fn(c + 1 < chunks ? full : tail, c * kGrain);
  });
}

// --- plain loops ------------------------------------------------------------

template <typename Op, typename T>
void ForwardLoop(const T* x, T* y, int64_t n, T a) {
  for (int64_t i = 0; i < n; ++i) y[i] = Op::Forward(x[i], a);
}

template <typename Op, typename T>
void BackwardLoop(const T* x, const T* dy, T* dx, int64_t n, T a) {
  for (int64_t i = 0; i < n; ++i) {
    // Both loads unconditional: a load of dy[i] sunk into a branch of the
    // piecewise gradients blocks vectorisation.
    const T xi = x[i], gi = dy[i];
    dx[i] = Op::Backward(xi, gi, a);
  }
}

}  // namespace

ActivationLayer::ActivationLayer(Activation declared, const std::string& name, const Args& args)
    : Layer(name), kind_(declared) {
  if (declared == Activation::kGeluErf && args.Has("approximate")) {
    const std::string& approx = args.String("approximate");
    if (approx == "tanh") {
      kind_ = Activation::kGeluTanh;
    } else if (approx != "none") {
      throw ConfigError(
          StrCat("gelu '", name, "': approximate must be none or tanh, got '", approx, "'"));
    }
  }
  if (declared == Activation::kLeakyRelu) {
    alpha_ = args.Has("negative_slope") ? args.Float("negative_slope") : 0.01;
    if (!std::isfinite(alpha_)) {
      throw ConfigError(
          StrCat("leaky_relu '", name, "': negative_slope must be finite, got ", alpha_));
    }
  }
}

const char* ActivationLayer::type() const { return Info(kind_).type; }

Shape ActivationLayer::Build(const std::vector<Shape>& inputs, DType /*dtype*/) {
  CNNFLOW_ENFORCE(inputs.size() == 1, type(), " takes 1 input, got ", inputs.size());
  return inputs[0];
}

void ActivationLayer::CheckForward(const Tensor& x, const Tensor& y) const {
  CNNFLOW_ENFORCE(x.numel() == y.numel(), type(), " ", name(), ": ", x.shape(), " -> ", y.shape());
}

void ActivationLayer::CheckBackward(const Tensor& x, const Tensor& dy, const Tensor& dx) const {
  CNNFLOW_ENFORCE(dy.numel() == x.numel() && dx.numel() == x.numel(), type(), " ", name(), ": x ",
                  x.shape(), " dy ", dy.shape(), " dx ", dx.shape());
}

void ActivationLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                              const ForwardContext& /*ctx*/) {
  const Tensor& in = *x[0];
  CheckForward(in, y);
  const ActivationInfo& info = Info(kind_);
  if (in.dtype() == DType::kF32 && info.onednn != dnnl::algorithm::undef) {
    const float* xs = in.data<float>();
    float* ys = y.data<float>();
    ForOnednnChunks(info, in.numel(),
                    [&](const Eltwise& e, int64_t b) { e.Forward(xs + b, ys + b); });
    return;
  }
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    T* ys = y.data<T>();
    const T a = static_cast<T>(alpha_);
    VisitActivation(kind_, [&](auto op) {
      cpu::ParallelFor(in.numel(), kGrain, [&](int64_t b, int64_t e) {
        ForwardLoop<decltype(op)>(xs + b, ys + b, e - b, a);
      });
    });
  });
}

void ActivationLayer::Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/,
                               const Tensor& dy, const std::vector<Tensor*>& dx) {
  if (dx[0] == nullptr) return;
  const Tensor& in = *x[0];
  CheckBackward(in, dy, *dx[0]);
  const ActivationInfo& info = Info(kind_);
  if (in.dtype() == DType::kF32 && info.onednn != dnnl::algorithm::undef) {
    const float* xs = in.data<float>();
    const float* g = dy.data<float>();
    float* d = dx[0]->data<float>();
    ForOnednnChunks(info, in.numel(),
                    [&](const Eltwise& e, int64_t b) { e.Backward(xs + b, g + b, d + b); });
    return;
  }
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    const T* g = dy.data<T>();
    T* d = dx[0]->data<T>();
    const T a = static_cast<T>(alpha_);
    VisitActivation(kind_, [&](auto op) {
      cpu::ParallelFor(in.numel(), kGrain, [&](int64_t b, int64_t e) {
        BackwardLoop<decltype(op)>(xs + b, g + b, d + b, e - b, a);
      });
    });
  });
}

namespace {

// The registered class of each YAML type.
template <Activation K>
class ActivationOf final : public ActivationLayer {
 public:
  ActivationOf(const std::string& name, const Args& args) : ActivationLayer(K, name, args) {}
};

}  // namespace

CNNFLOW_REGISTER_LAYER(gelu, ActivationOf<Activation::kGeluErf>,
                       Schema("Gaussian error linear unit (torch.nn.GELU): x * Phi(x), Phi the "
                              "standard normal CDF (erf), or its tanh approximation "
                              "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).")
                           .Choice("approximate", {"none", "tanh"}, "none",
                                   "none: the exact erf form; tanh: the tanh approximation"));
CNNFLOW_REGISTER_LAYER(silu, ActivationOf<Activation::kSilu>,
                       Schema("Sigmoid linear unit / swish (torch.nn.SiLU): x * sigmoid(x)."));
CNNFLOW_REGISTER_LAYER(sigmoid, ActivationOf<Activation::kSigmoid>,
                       Schema("Logistic sigmoid (torch.nn.Sigmoid): 1 / (1 + exp(-x))."));
CNNFLOW_REGISTER_LAYER(tanh, ActivationOf<Activation::kTanh>,
                       Schema("Hyperbolic tangent (torch.nn.Tanh)."));
CNNFLOW_REGISTER_LAYER(hardsigmoid, ActivationOf<Activation::kHardsigmoid>,
                       Schema("Hard sigmoid (torch.nn.Hardsigmoid): relu6(x + 3) / 6."));
CNNFLOW_REGISTER_LAYER(hardswish, ActivationOf<Activation::kHardswish>,
                       Schema("Hard swish (torch.nn.Hardswish): x * relu6(x + 3) / 6."));
CNNFLOW_REGISTER_LAYER(relu6, ActivationOf<Activation::kRelu6>,
                       Schema("ReLU capped at 6 (torch.nn.ReLU6): min(max(x, 0), 6)."));
CNNFLOW_REGISTER_LAYER(leaky_relu, ActivationOf<Activation::kLeakyRelu>,
                       Schema("Leaky rectifier (torch.nn.LeakyReLU): x if x > 0 else "
                              "negative_slope * x.")
                           .Optional("negative_slope", ParamType::kFloat, 0.01,
                                     "the slope for x < 0"));

}  // namespace cnnflow
