// Constants and shapes: Constant and Identity (values under another name);
// Shape of a computed value (a constant with the batch symbolic) and the
// shape arithmetic on constants the importer folds (Unsqueeze, Gather,
// Cast, Concat, Add, Sub, Mul, Div: onnx/import_constants.cc);
// a Transpose only of a constant (a weight's, folded by the importer) or in
// a channel shuffle (onnx/import_patterns.cc); Flatten (axis 1) and Reshape
// [N, -1] <-> flatten (nothing when the sample is flat already);
// channel_shuffle out as Reshape -> Transpose -> Reshape.
#include <algorithm>
#include <vector>

#include "onnx/converter.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"
#include "onnx/tensor_proto.h"
#include "ops/layers/channel_shuffle.h"

namespace cnnflow::onnx_io {
namespace {

void ImportConstant(OnnxImporter& im, int i, NodeAttrs& a) {
  const auto& n = im.node(i);
  Tensor t;
  if (const onnx::TensorProto* v = a.TensorAttr("value")) {
    t = ReadTensor(*v, im.Where(i));
  } else if (a.Has("value_float")) {
    t = Tensor::Full(Shape{1}, a.Float("value_float", 0));
  } else if (a.Has("value_int")) {
    t = Tensor::Full(Shape{1}, static_cast<double>(a.Int("value_int", 0)), DType::kI64);
  } else if (a.Has("value_ints")) {
    const std::vector<int64_t> v = a.Ints("value_ints", {});
    t = Tensor::Empty(Shape{static_cast<int64_t>(v.size())}, DType::kI64);
    std::copy(v.begin(), v.end(), t.data<int64_t>());
  } else if (a.Has("value_floats")) {
    const std::vector<float> v = a.Floats("value_floats");
    t = Tensor::Empty(Shape{static_cast<int64_t>(v.size())}, DType::kF32);
    std::copy(v.begin(), v.end(), t.data<float>());
  }
  a.Done();
  if (t.numel() == 0 && t.shape().rank() == 0) im.Fail(i, "has no value the importer reads");
  im.SetConst(n.output(0), t);
}

void ImportFlatten(OnnxImporter& im, int i, NodeAttrs& a) {
  const Val x = im.ValIn(i, 0);
  if (im.node(i).op_type() == "Flatten") {
    const int64_t axis = a.Int("axis", 1);
    a.Done();
    if (axis != 1)
      im.Fail(i,
              StrCat("flattens from axis ", axis, "; cnnflow's flatten keeps the batch (axis 1)"));
  } else {
    a.Int("allowzero", 0);
    a.Done();
    if (!im.IsFlatten(i, x.shape)) {
      im.Fail(i,
              im.HasIn(i, 1) && !im.IsConst(im.In(i, 1))
                  ? "its target shape is computed by nodes the importer does not fold"
                  : "reshapes to another shape than [N, -1]; only that flatten is a cnnflow layer");
    }
  }
  if (x.shape.rank() == 1) return im.Alias(i, im.In(i, 0));
  im.Simple(i, "flatten");
}

// The shape of a computed value as a constant: its per-sample dimensions
// are known, its batch size is the symbolic kBatchDim (the shape arithmetic
// that follows is folded, onnx/import_constants.cc).
void ImportShape(OnnxImporter& im, int i, NodeAttrs& a) {
  const Val x = im.ValIn(i, 0);
  std::vector<int64_t> dims = {kBatchDim};
  dims.insert(dims.end(), x.shape.dims().begin(), x.shape.dims().end());
  const auto rank = static_cast<int64_t>(dims.size());
  int64_t start = a.Int("start", 0), end = a.Int("end", rank);  // opset 15
  a.Done();
  start = std::clamp(start < 0 ? start + rank : start, int64_t{0}, rank);
  end = std::clamp(end < 0 ? end + rank : end, start, rank);
  Tensor t = Tensor::Empty(Shape{end - start}, DType::kI64);
  for (int64_t k = start; k < end; ++k) t.Set(k - start, static_cast<double>(dims[k]));
  im.SetConst(im.node(i).output(0), t);
}

// A computed value to channels-last, [N, C, ...] -> [N, ..., C], or back:
// no layer, the value seen in the other layout (Val::channels_last).
void ImportTranspose(OnnxImporter& im, int i, NodeAttrs& a) {
  const Val x = im.ValIn(i, 0);
  const int64_t rank = x.shape.rank() + 1;
  const std::vector<int64_t> perm = a.Ints("perm", {});
  a.Done();
  std::vector<int64_t> to_last = {0}, back = {0, rank - 1};
  for (int64_t d = 2; d < rank; ++d) to_last.push_back(d);
  to_last.push_back(1);
  for (int64_t d = 1; d < rank - 1; ++d) back.push_back(d);
  if (rank >= 3 && !x.channels_last && perm == to_last) return im.AliasLayout(i, im.In(i, 0), true);
  if (rank >= 3 && x.channels_last && perm == back) return im.AliasLayout(i, im.In(i, 0), false);
  im.Fail(i, StrCat("transposes a computed value by ", Shape(perm),
                    "; cnnflow maps a Transpose of a constant (a weight), to channels-last and "
                    "back, or in a channel shuffle"));
}

// Ops the importer folds where their inputs are constants (shape
// arithmetic) and has no layer for otherwise.
void ConstantsOnly(OnnxImporter& im, int i, NodeAttrs&) {
  im.Fail(i, StrCat("computes on a value that is not a constant; cnnflow folds ",
                    im.node(i).op_type(), " of constants (shape arithmetic) only"));
}

// x.view(N, g, C/g, ...).transpose(1, 2).reshape(N, C, ...), as torchvision
// writes ShuffleNet's channel_shuffle (and the importer reads it back).
void ExportChannelShuffle(OnnxExporter& ex, int i) {
  const auto& l = ex.As<ChannelShuffleLayer>(i);
  const Shape s = ex.InShape(i);
  const std::string p = l.name() + "/";
  std::vector<int64_t> split = {0, l.groups(), l.channels() / l.groups()}, back = {0, l.channels()};
  std::vector<int64_t> perm = {0, 2, 1};
  for (int d = 1; d < s.rank(); ++d) {
    split.push_back(s[d]);
    back.push_back(s[d]);
    perm.push_back(static_cast<int64_t>(perm.size()));
  }
  ex.AddInts(p + "split_shape", split);
  ex.AddInts(p + "shape", back);
  const std::string grouped = ex.Step(i, "Reshape", {ex.In(i), p + "split_shape"}, "grouped");
  const std::string swapped = p + "swapped";
  ex.Ints(ex.Node("Transpose", i, {grouped}, swapped, "/swapped"), "perm", perm);
  ex.Step(i, "Reshape", {swapped, p + "shape"}, "shuffled", true);
}

void ExportFlatten(OnnxExporter& ex, int i) {
  ex.Int(ex.Node("Flatten", i, {ex.In(i)}, ex.Out(i)), "axis", 1);
}

}  // namespace

CNNFLOW_ONNX_IMPORT(Constant, "a constant (value, value_float(s), value_int(s))", ImportConstant);
CNNFLOW_ONNX_IMPORT(Identity, "nothing: its input under another name",
                    [](OnnxImporter& im, int i, NodeAttrs& a) {
                      a.Done();
                      im.Alias(i, im.In(i, 0));
                    });
CNNFLOW_ONNX_IMPORT(Transpose,
                    "of a 2-D constant (a weight's, folded); to channels-last and back (a view "
                    "the elementwise ops, LayerNormalization and MatMul read: ConvNeXt); in a "
                    "channel shuffle (Reshape -> Transpose -> Reshape: channel_shuffle)",
                    ImportTranspose);
CNNFLOW_ONNX_IMPORT(Shape,
                    "a constant: the per-sample shape, the batch symbolic (x.view(x.size(0), "
                    "-1) and the like are folded)",
                    ImportShape);
CNNFLOW_ONNX_IMPORT(Unsqueeze, "of constants (a shape's pieces; folded)", ConstantsOnly);
CNNFLOW_ONNX_IMPORT(Gather, "of constants (a shape's dimension; folded)", ConstantsOnly);
CNNFLOW_ONNX_IMPORT(Cast, "of constants (folded)", ConstantsOnly);
CNNFLOW_ONNX_IMPORT(Sub, "of constants (folded)", ConstantsOnly);
CNNFLOW_ONNX_IMPORT(Flatten, "flatten (axis 1)", ImportFlatten);
CNNFLOW_ONNX_IMPORT(Reshape, "flatten (to a constant [N, -1])", ImportFlatten);
CNNFLOW_ONNX_EXPORT(flatten, "Flatten (axis 1)", ExportFlatten);
CNNFLOW_ONNX_EXPORT(channel_shuffle, "Reshape [N, g, C/g, ...] -> Transpose -> Reshape [N, C, ...]",
                    ExportChannelShuffle);

}  // namespace cnnflow::onnx_io
