#include "ops/linear.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/gemm.h"
#include "ops/cpu/parallel.h"

namespace cnnflow {

namespace {

// Work per parallel chunk of a GEMM, in multiply-adds: smaller chunks cost
// more in OpenBLAS's repacking of the shared operand than they gain.
constexpr int64_t kMinMacsPerChunk = int64_t{1} << 19;

// Chunks for splitting `rows` rows of `macs_per_row` multiply-adds each.
// Depends only on the sizes, so results never depend on the thread count.
int64_t GemmChunks(int64_t rows, int64_t macs_per_row) {
  const int64_t min_rows = std::max<int64_t>(1, kMinMacsPerChunk / std::max<int64_t>(macs_per_row, 1));
  return cpu::NumChunks(rows, min_rows);
}

}  // namespace

LinearLayer::LinearLayer(const std::string& name, const Args& args)
    : Layer(name), in_(args.Int("in")), out_(args.Int("out")), has_bias_(args.Bool("bias")) {
  if (out_ <= 0) throw ConfigError(StrCat("linear '", name, "': out must be positive, got ", out_));
  if (in_ < 0) throw ConfigError(StrCat("linear '", name, "': in must be >= 0, got ", in_));
  cpu::PinLibraryThreads();  // OpenBLAS runs inside TBB tasks: one thread each
}

Shape LinearLayer::Build(const std::vector<Shape>& inputs, DType dtype) {
  CNNFLOW_ENFORCE(inputs.size() == 1, "linear takes 1 input, got ", inputs.size());
  const Shape& s = inputs[0];
  if (s.rank() < 1) throw ShapeError(StrCat("linear expects a sample of rank >= 1, got ", s));
  const int64_t f = s.numel();
  if (in_ != 0 && in_ != f) {
    throw ShapeError(
        StrCat("expects ", in_, " input features (in: ", in_, "), got ", s, " = ", f));
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
    const T* b = has_bias_ ? parameters()[1].value.data<T>() : nullptr;
    T* ys = y.data<T>();
    const int64_t in_f = in_, out_f = out_;
    // Rows of the batch are independent: each chunk is one GEMM.
    cpu::ForChunks(n, GemmChunks(n, in_f * out_f), [&](int64_t, int64_t r0, int64_t r1) {
      T* yr = ys + r0 * out_f;
      if (b != nullptr) {
        for (int64_t r = r0; r < r1; ++r) std::copy(b, b + out_f, ys + r * out_f);
      }
      cpu::Gemm<T>(false, true, r1 - r0, out_f, in_f, T(1), xs + r0 * in_f, in_f, w, in_f,
                   b != nullptr ? T(1) : T(0), yr, out_f);
    });
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
    const int64_t in_f = in_, out_f = out_;

    // dX[N, F] = dY[N, out] W[out, F], split over batch rows.
    if (dx[0] != nullptr) {
      T* dxs = dx[0]->data<T>();
      cpu::ForChunks(n, GemmChunks(n, in_f * out_f), [&](int64_t, int64_t r0, int64_t r1) {
        cpu::Gemm<T>(false, false, r1 - r0, in_f, out_f, T(1), g + r0 * out_f, out_f, w, in_f,
                     T(0), dxs + r0 * in_f, in_f);
      });
    }
    // dW[out, F] += dY^T[out, N] X[N, F], split over output rows: each
    // element is summed over the batch by one GEMM, so no cross-chunk sums.
    cpu::ForChunks(out_f, GemmChunks(out_f, in_f * n), [&](int64_t, int64_t o0, int64_t o1) {
      cpu::Gemm<T>(true, false, o1 - o0, in_f, n, T(1), g + o0, out_f, xs, in_f, T(1),
                   dw + o0 * in_f, in_f);
    });
    // db[out] += sum over rows of dY: the batch in order, vectorised over out.
    if (has_bias_) {
      T* db = parameters()[1].grad.data<T>();
      for (int64_t r = 0; r < n; ++r) {
        const T* gr = g + r * out_f;
        for (int64_t o = 0; o < out_f; ++o) db[o] += gr[o];
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
