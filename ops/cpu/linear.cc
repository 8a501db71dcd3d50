#include "ops/layers/linear.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ops/cpu/gemm.h"
#include "ops/cpu/parallel.h"

namespace cnnflow {

namespace {

// Work per parallel chunk of a GEMM, in multiply-adds (a few hundred
// microseconds of sgemm): every chunk repacks the operand the chunks share,
// so small chunks cost more than the parallelism gains.
constexpr int64_t kMinMacsPerChunk = int64_t{8} << 20;
// Chunk boundaries fall on multiples of this many rows/columns (a SIMD
// register of floats: the kernels' tiles stay whole).
constexpr int64_t kSplitAlign = 16;

// C[M, N] = alpha * op(A) op(B) + beta * C, split into independent GEMMs
// along M or N, whichever is larger: the chunks then share (and each
// repack) the smaller operand. Each element of C is computed by exactly
// one chunk, and the split depends only on the sizes, so the result is the
// same for any thread count. Measured on Fashion-MNIST's 3136 -> 128
// layer: splitting the batch rows cost 1.4x the unsplit GEMM for 2 chunks
// and 5x for 16 (each chunk repacks all of W); the larger dimension, 1.0-1.3x.
// bf16: the products in bf16 (f32 only).
template <typename T>
void ParallelGemm(bool bf16, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                  const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  auto gemm = [&](int64_t m, int64_t n, const T* a, const T* b, T* c) {
    if constexpr (std::is_same_v<T, float>) {
      if (bf16) return cpu::GemmBf16(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
    }
    cpu::Gemm<T>(trans_a, trans_b, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc);
  };
  const bool split_m = m >= n;
  const int64_t len = split_m ? m : n;
  const int64_t blocks = (len + kSplitAlign - 1) / kSplitAlign;
  // A power of two, so 2 or 4 threads get equal shares.
  int64_t chunks =
      std::clamp<int64_t>(m * n * k / kMinMacsPerChunk, 1, std::min(blocks, cpu::kMaxChunks));
  while (chunks & (chunks - 1)) chunks &= chunks - 1;
  cpu::ForChunks(blocks, chunks, [&](int64_t, int64_t b0, int64_t b1) {
    const int64_t i0 = b0 * kSplitAlign, i1 = std::min(len, b1 * kSplitAlign);
    if (split_m) {  // rows [i0, i1) of op(A) and C
      gemm(i1 - i0, n, trans_a ? a + i0 : a + i0 * lda, b, c + i0 * ldc);
    } else {  // columns [i0, i1) of op(B) and C
      gemm(m, i1 - i0, a, trans_b ? b + i0 * ldb : b + i0, c + i0);
    }
  });
}

}  // namespace

LinearLayer::LinearLayer(const std::string& name, const Args& args)
    : Layer(name), in_(args.Int("in")), out_(args.Int("out")), has_bias_(args.Bool("bias")) {
  if (out_ <= 0) throw ConfigError(StrCat("linear '", name, "': out must be positive, got ", out_));
  if (in_ < 0) throw ConfigError(StrCat("linear '", name, "': in must be >= 0, got ", in_));
}

Shape LinearLayer::Build(const std::vector<Shape>& inputs, DType dtype) {
  CNNFLOW_ENFORCE(inputs.size() == 1, "linear takes 1 input, got ", inputs.size());
  const Shape& s = inputs[0];
  if (s.rank() < 1) throw ShapeError(StrCat("linear expects a sample of rank >= 1, got ", s));
  const int64_t f = s.numel();
  if (in_ != 0 && in_ != f) {
    throw ShapeError(StrCat("expects ", in_, " input features (in: ", in_, "), got ", s, " = ", f));
  }
  in_ = f;
  AddParameter("weight", Shape{out_, in_}, dtype);
  if (has_bias_) AddParameter("bias", Shape{out_}, dtype);
  return Shape{out_};
}

void LinearLayer::ResetParameters(Rng& rng) {
  // kaiming_uniform_(a = sqrt(5)) gives bound 1/sqrt(fan_in); so does the bias.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
  for (auto& p : parameters()) {
    for (int64_t i = 0; i < p.value.numel(); ++i) p.value.Set(i, rng.Uniform(-bound, bound));
  }
}

void LinearLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                          const ForwardContext& /*ctx*/) {
  const Tensor& in = *x[0];
  const int64_t n = in.dim(0);
  CNNFLOW_ENFORCE(in.numel() == n * in_ && y.numel() == n * out_, "linear ", name(), ": input ",
                  in.shape(), " output ", y.shape());
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    const T* w = parameters()[0].value.data<T>();
    T* ys = y.data<T>();
    // Y[N, out] = b (broadcast), then Y += X[N, F] W^T.
    if (has_bias_) {
      const T* b = parameters()[1].value.data<T>();
      for (int64_t r = 0; r < n; ++r) std::copy(b, b + out_, ys + r * out_);
    }
    ParallelGemm<T>(bf16_, false, true, n, out_, in_, xs, in_, w, in_, has_bias_ ? T(1) : T(0), ys,
                    out_);
  });
}

void LinearLayer::Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/,
                           const Tensor& dy, const std::vector<Tensor*>& dx) {
  const Tensor& in = *x[0];
  const int64_t n = in.dim(0);
  CNNFLOW_ENFORCE(dy.numel() == n * out_, "linear ", name(), ": dy ", dy.shape());
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    const T* g = dy.data<T>();
    Parameter& wp = parameters()[0];
    const T* w = wp.value.data<T>();
    T* dw = wp.grad.data<T>();
    // dX[N, F] = dY[N, out] W[out, F].
    if (dx[0] != nullptr) {
      ParallelGemm<T>(bf16_, false, false, n, in_, out_, g, out_, w, in_, T(0), dx[0]->data<T>(),
                      in_);
    }
    // dW[out, F] += dY^T[out, N] X[N, F]: each element's sum over the batch
    // is inside one GEMM call, never split across chunks.
    ParallelGemm<T>(bf16_, true, false, out_, in_, n, g, out_, xs, in_, T(1), dw, in_);
    // db[out] += sum over rows of dY: the batch in order, vectorised over out.
    if (has_bias_) {
      T* db = parameters()[1].grad.data<T>();
      for (int64_t r = 0; r < n; ++r) {
        const T* gr = g + r * out_;
        for (int64_t o = 0; o < out_; ++o) db[o] += gr[o];
      }
    }
  });
}

CNNFLOW_REGISTER_LAYER(linear, LinearLayer,
                       Schema("Fully connected layer y = x W^T + b (torch.nn.Linear); a sample "
                              "of any rank is flattened first.")
                           .Required("out", ParamType::kInt, "number of output features")
                           .Optional("bias", ParamType::kBool, true, "learn an additive bias")
                           .Optional("in", ParamType::kInt, int64_t{0},
                                     "number of input features; 0 infers it from the input "
                                     "shape, another value is checked against it"));

}  // namespace cnnflow
