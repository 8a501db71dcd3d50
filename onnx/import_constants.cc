// The importer's constant folding: nodes whose inputs are all constants are
// computed at import and their outputs join the constants, so that what an
// exporter writes around weights and shapes becomes attributes. Folded:
// Identity, a weight's 2-D Transpose, Concat, Unsqueeze and Gather of
// vectors, Cast, and Add, Sub, Mul, Div elementwise. With Shape (a
// converter, onnx/converters/shape.cc) this is the shape arithmetic of
// `x.view(x.size(0), -1)` and ShuffleNet's channel shuffle: the batch size
// is the symbolic kBatchDim, and any arithmetic on it gives kUnknownDim,
// which no Reshape accepts.
#include <algorithm>
#include <cmath>

#include "onnx/importer.h"
#include "onnx/tensor_proto.h"

namespace cnnflow::onnx_io {
namespace {

bool Symbolic(double v) { return v == kBatchDim || v == kUnknownDim; }

// The ONNX TensorProto data types Cast may name, as cnnflow's dtypes of
// constants (integers as I64, floating types as F32).
DType CastTarget(int64_t to) {
  switch (to) {
    case 1:
    case 10:
    case 11:
    case 16:  // float, float16, double, bfloat16
      return DType::kF32;
    case 2:
    case 3:
    case 4:
    case 5:
    case 6:
    case 7:
    case 9:
    case 12:
    case 13:  // ints, bool
      return DType::kI64;
    default:
      return DType::kF32;
  }
}

}  // namespace

bool OnnxImporter::FoldConstant(int i) {
  const auto& n = g_.node(i);
  const std::string& op = n.op_type();
  if (op == "Constant") return Convert(i), true;  // its converter sets the constant
  if (n.input_size() == 0 || n.output_size() < 1 || n.output(0).empty()) return false;
  for (const auto& v : n.input())
    if (!v.empty() && !IsConst(v)) return false;
  if (op == "Identity") return Convert(i), true;
  NodeAttrs a(n, Where(i));
  std::optional<Tensor> out;
  if (op == "Transpose") {
    const Tensor& t = ConstIn(i, 0);
    const std::vector<int64_t> perm = a.Ints("perm", {1, 0});
    a.Done();
    if (t.shape().rank() != 2 || perm != std::vector<int64_t>{1, 0} || t.dtype() != DType::kF32) {
      Fail(i, "transposes a constant other than a 2-D float matrix");
    }
    out = Transposed(t);
  } else if (op == "Unsqueeze") {
    out = FoldUnsqueeze(i, a);
  } else if (op == "Concat") {
    out = FoldConcat(i, a);
  } else if (op == "Gather") {
    out = FoldGather(i, a);
  } else if (op == "Cast") {
    const Tensor& t = ConstIn(i, 0);
    const DType to = CastTarget(a.Int("to", 1));
    a.Done();
    Tensor c = Tensor::Empty(t.shape(), to);
    for (int64_t k = 0; k < t.numel(); ++k) {
      const double v = t.At(k);
      c.Set(k, to == DType::kI64 && !Symbolic(v) ? std::trunc(v) : v);
    }
    out = c;
  } else if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") {
    a.Done();
    out = FoldArithmetic(i);
  }
  if (!out) return false;
  consts_[n.output(0)] = *out;
  return true;
}

std::optional<Tensor> OnnxImporter::FoldUnsqueeze(int i, NodeAttrs& a) {
  const Tensor& t = ConstIn(i, 0);
  std::vector<int64_t> axes = a.Ints("axes", {});  // opset < 13
  a.Done();
  if (HasIn(i, 1)) axes = IntsOf(ConstIn(i, 1));
  std::vector<int64_t> dims = t.shape().dims();
  // A scalar (read as [1], ReadTensor) made a vector of one: still [1].
  if (t.shape() == Shape{1} && axes.size() == 1) dims.clear();
  std::sort(axes.begin(), axes.end());
  for (int64_t ax : axes) {
    if (ax < 0) ax += static_cast<int64_t>(dims.size() + axes.size());
    if (ax < 0 || ax > static_cast<int64_t>(dims.size())) Fail(i, "unsqueezes past the rank");
    dims.insert(dims.begin() + ax, 1);
  }
  return t.Reshape(Shape(dims));
}

std::optional<Tensor> OnnxImporter::FoldConcat(int i, NodeAttrs& a) {
  const auto& n = g_.node(i);
  const int64_t axis = a.Int("axis", 0);
  a.Done();
  std::vector<double> v;
  const DType dtype = ConstIn(i, 0).dtype();
  for (int k = 0; k < n.input_size(); ++k) {
    const Tensor& t = ConstIn(i, k);
    if (t.shape().rank() != 1 || t.dtype() != dtype || (axis != 0 && axis != -1)) {
      Fail(i, "concatenates constants other than vectors of one type");
    }
    for (int64_t j = 0; j < t.numel(); ++j) v.push_back(t.At(j));
  }
  Tensor out = Tensor::Empty(Shape{static_cast<int64_t>(v.size())}, dtype);
  for (size_t j = 0; j < v.size(); ++j) out.Set(static_cast<int64_t>(j), v[j]);
  return out;
}

// Gather along axis 0 of a vector (a dimension of a shape): indices a
// scalar (read as [1]) or a vector, negative ones from the end.
std::optional<Tensor> OnnxImporter::FoldGather(int i, NodeAttrs& a) {
  const Tensor& data = ConstIn(i, 0);
  const Tensor& index = ConstIn(i, 1);
  const int64_t axis = a.Int("axis", 0);
  a.Done();
  if (data.shape().rank() != 1 || axis != 0) Fail(i, "gathers from a constant other than a vector");
  Tensor out = Tensor::Empty(index.shape(), data.dtype());
  for (int64_t k = 0; k < index.numel(); ++k) {
    int64_t j = static_cast<int64_t>(index.At(k));
    if (j < 0) j += data.numel();
    if (j < 0 || j >= data.numel()) Fail(i, StrCat("index ", index.At(k), " is out of range"));
    out.Set(k, data.At(j));
  }
  return out;
}

// Add, Sub, Mul, Div of two constants of one shape, or of a constant and a
// one-value one (integers divide as ONNX's, truncating). Others: nullopt.
std::optional<Tensor> OnnxImporter::FoldArithmetic(int i) {
  const std::string& op = g_.node(i).op_type();
  const Tensor& x = ConstIn(i, 0);
  const Tensor& y = ConstIn(i, 1);
  const bool same = x.shape() == y.shape();
  if (!same && x.numel() != 1 && y.numel() != 1) return std::nullopt;
  const Tensor& big = x.numel() >= y.numel() ? x : y;
  const bool integer = x.dtype() == DType::kI64 && y.dtype() == DType::kI64;
  Tensor out = Tensor::Empty(big.shape(), integer ? DType::kI64 : DType::kF32);
  for (int64_t k = 0; k < out.numel(); ++k) {
    const double p = x.At(x.numel() == 1 ? 0 : k), q = y.At(y.numel() == 1 ? 0 : k);
    double r = kUnknownDim;
    if (!Symbolic(p) && !Symbolic(q)) {
      r = op == "Add" ? p + q : op == "Sub" ? p - q : op == "Mul" ? p * q : q == 0 ? NAN : p / q;
      if (integer && op == "Div") r = std::trunc(r);
    }
    if (integer && std::isnan(r)) Fail(i, "divides an integer constant by 0");
    out.Set(k, r);
  }
  return out;
}

}  // namespace cnnflow::onnx_io
