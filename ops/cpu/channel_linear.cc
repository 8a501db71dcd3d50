// channel_linear on the CPU: per sample one GEMM over all positions (P =
// H*W or L), parallel over the batch (ops/cpu/gemm.h, single-threaded each):
//   forward   Y_n[K, P]  = W[K, C] X_n[C, P]  (+ b: Y_n starts as it)
//   backward  dX_n[C, P] = W^T[C, K] dY_n[K, P]
//             dW[K, C]  += dY_n[K, P] X_n^T[P, C];  db[K] += row sums of dY_n
// The batch is cut into ForChunks chunks (a count that depends on the shape
// only); each chunk sums its own dW and db, then the chunks are added in
// order, so results are bitwise the same for any thread count (conv2d's
// rule, ops/cpu/conv/chunks.h, whose pointwise path this is without the
// [K, C, 1, 1] layout).
#include "ops/layers/channel_linear.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/elementwise.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/parallel.h"

namespace cnnflow {

namespace {
// A backward chunk covers at least this many positions, so that adding the
// chunks' partial dW stays small next to the GEMMs (conv2d's figure,
// BackwardChunks in ops/cpu/conv/chunks.h).
constexpr int64_t kMinChunkPositions = 400;
}  // namespace

ChannelLinearLayer::ChannelLinearLayer(const std::string& name, const Args& args)
    : Layer(name), out_(args.Int("out")), has_bias_(args.Bool("bias")) {
  if (out_ <= 0) {
    throw ConfigError(StrCat("channel_linear '", name, "': out must be positive, got ", out_));
  }
}

Shape ChannelLinearLayer::Build(const std::vector<Shape>& inputs, DType dtype) {
  CNNFLOW_ENFORCE(inputs.size() == 1, "channel_linear takes 1 input, got ", inputs.size());
  const Shape& s = inputs[0];
  if (s.rank() < 1) {
    throw ShapeError(StrCat("channel_linear expects samples [C, ...], got ", s));
  }
  in_ = s[0];
  positions_ = s.numel() / in_;
  AddParameter("weight", Shape{out_, in_}, dtype);
  if (has_bias_) AddParameter("bias", Shape{out_}, dtype);
  Shape out = s;
  out[0] = out_;
  return out;
}

void ChannelLinearLayer::ResetParameters(Rng& rng) {
  // nn.Linear: kaiming_uniform_(a = sqrt(5)) gives bound 1/sqrt(in); so does the bias.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
  for (auto& p : parameters()) {
    for (int64_t i = 0; i < p.value.numel(); ++i) p.value.Set(i, rng.Uniform(-bound, bound));
  }
}

void ChannelLinearLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                                 const ForwardContext& /*ctx*/) {
  const Tensor& in = *x[0];
  const int64_t n = in.dim(0), p = positions_;
  CNNFLOW_ENFORCE(in.numel() == n * in_ * p && y.numel() == n * out_ * p, "channel_linear ", name(),
                  ": input ", in.shape(), " output ", y.shape());
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    const T* w = parameters()[0].value.data<T>();
    const T* b = has_bias_ ? parameters()[1].value.data<T>() : nullptr;
    T* ys = y.data<T>();
    cpu::ForChunks(n, cpu::NumChunks(n), [&](int64_t, int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        T* yi = ys + i * out_ * p;
        if (b != nullptr) {
          for (int64_t k = 0; k < out_; ++k) std::fill(yi + k * p, yi + (k + 1) * p, b[k]);
        }
        cpu::Gemm<T>(false, false, out_, p, in_, T(1), w, in_, xs + i * in_ * p, p,
                     b != nullptr ? T(1) : T(0), yi, p);
      }
    });
  });
}

void ChannelLinearLayer::Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/,
                                  const Tensor& dy, const std::vector<Tensor*>& dx) {
  const Tensor& in = *x[0];
  const int64_t n = in.dim(0), p = positions_;
  CNNFLOW_ENFORCE(dy.numel() == n * out_ * p, "channel_linear ", name(), ": dy ", dy.shape());
  const int64_t chunks = cpu::NumChunks(n, (kMinChunkPositions + p - 1) / p);
  const int64_t part = out_ * in_ + (has_bias_ ? out_ : 0);  // one chunk's dW then db
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (!partial_.defined() || partial_.dtype() != in.dtype() || partial_.numel() < chunks * part) {
      partial_ = Tensor::Empty({chunks * part}, in.dtype());
    }
    const T* xs = in.data<T>();
    const T* g = dy.data<T>();
    const T* w = parameters()[0].value.data<T>();
    T* dxs = dx[0] != nullptr ? dx[0]->data<T>() : nullptr;
    T* partial = partial_.data<T>();
    cpu::ForChunks(n, chunks, [&](int64_t chunk, int64_t begin, int64_t end) {
      T* pdw = partial + chunk * part;
      T* pdb = pdw + out_ * in_;
      std::fill(pdw, pdw + part, T(0));
      for (int64_t i = begin; i < end; ++i) {
        const T* gi = g + i * out_ * p;
        const T* xi = xs + i * in_ * p;
        cpu::Gemm<T>(false, true, out_, in_, p, T(1), gi, p, xi, p, T(1), pdw, in_);
        if (dxs != nullptr) {
          cpu::Gemm<T>(true, false, in_, p, out_, T(1), w, in_, gi, p, T(0), dxs + i * in_ * p, p);
        }
        if (has_bias_) {
          for (int64_t k = 0; k < out_; ++k) pdb[k] += RowSum(gi + k * p, p);
        }
      }
    });
    // The chunks' sums in chunk order, vectorised over the elements.
    T* dw = parameters()[0].grad.data<T>();
    T* db = has_bias_ ? parameters()[1].grad.data<T>() : nullptr;
    for (int64_t c = 0; c < chunks; ++c) {
      const T* pc = partial + c * part;
      for (int64_t j = 0; j < out_ * in_; ++j) dw[j] += pc[j];
      for (int64_t k = 0; db != nullptr && k < out_; ++k) db[k] += pc[out_ * in_ + k];
    }
  });
}

CNNFLOW_REGISTER_LAYER(channel_linear, ChannelLinearLayer,
                       Schema("torch.nn.Linear over the channels at each position of [C, H, W] "
                              "or [C, L] samples (ConvNeXt's pointwise layers): weight [out, C], "
                              "bias [out]; a 1x1 convolution with nn.Linear's layout and init.")
                           .Required("out", ParamType::kInt, "number of output channels")
                           .Optional("bias", ParamType::kBool, true, "learn an additive bias"));

}  // namespace cnnflow
