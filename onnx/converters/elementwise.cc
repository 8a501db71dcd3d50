// Elementwise, joining and splitting ops: Add, Mul, Concat of computed
// values <-> add, mul, concat (axis 1); Slice and Split along the channels
// -> channel_slice (out: Slice); Mul by a scalar -> mul {scale} (out: Mul by a [1]
// initializer), by a [C, 1, 1] tensor -> layer_scale (out: Mul by gamma
// [C, 1, 1], the initializer named as the layer); Div by a scalar ->
// mul {scale: 1 / c}; mul's gate s [N, C] out unsqueezed to x's rank.
#include <algorithm>
#include <utility>
#include <vector>

#include "onnx/converter.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"
#include "onnx/tensor_proto.h"
#include "ops/layers/channel_slice.h"
#include "ops/layers/mul.h"

namespace cnnflow::onnx_io {
namespace {

// Add, Mul, Div of computed values and constants.
void ImportArithmetic(OnnxImporter& im, int i, NodeAttrs& a) {
  a.Done();
  const auto& n = im.node(i);
  const std::string& op = n.op_type();
  if (n.input_size() != 2) im.Fail(i, "needs two inputs");
  const bool c0 = im.IsConst(im.In(i, 0)), c1 = im.IsConst(im.In(i, 1));
  if (c0 && c1)
    im.Fail(i, "computes on constants alone (fold them: do_constant_folding=True does)");
  if (!c0 && !c1) {
    if (op == "Div") im.Fail(i, "divides one computed value by another; cnnflow has no such layer");
    std::vector<std::string> ins = {im.In(i, 0), im.In(i, 1)};
    // mul's second input is the one broadcast ([C, 1, 1] gates).
    if (op == "Mul" && im.ValIn(i, 0).shape.numel() < im.ValIn(i, 1).shape.numel())
      std::swap(ins[0], ins[1]);
    return im.AddLayer(i, im.ScopeName(i), op == "Add" ? "add" : "mul", Args(), ins, {},
                       n.output(0));
  }
  const int xk = c0 ? 1 : 0;
  const Val x = im.ValIn(i, xk);
  const std::string& cname = im.In(i, 1 - xk);
  const Tensor& c = im.Const(cname);
  if (c.dtype() != DType::kF32) im.Fail(i, "its constant is not a floating-point tensor");
  if (op == "Add") {
    im.Fail(i,
            "adds a constant tensor to a computed value; cnnflow has no such layer (a bias "
            "belongs to the layer before)");
  }
  if (op == "Div" && xk != 0)
    im.Fail(i, "divides a constant by a computed value; cnnflow has no such layer");
  if (c.numel() == 1) {
    const double s = op == "Div" ? 1.0 / c.At(0) : c.At(0);
    Args args;
    args.Set("scale", std::vector<double>{Decimal(static_cast<float>(s))});
    return im.Simple(i, "mul", args, im.In(i, xk));
  }
  // A per-channel scale: [C, 1, 1] (with a leading 1 or not) is ConvNeXt's
  // layer scale; over a channels-last view, [C].
  const int64_t channels = x.shape[0];
  bool per_channel = c.numel() == channels && x.shape.rank() >= 2;
  if (per_channel && x.channels_last) {
    per_channel = c.shape().rank() == 1;
  } else if (per_channel) {
    const auto& d = c.shape().dims();
    per_channel =
        d.size() >= static_cast<size_t>(x.shape.rank()) &&
        std::all_of(d.end() - (x.shape.rank() - 1), d.end(), [](int64_t n) { return n == 1; });
  }
  if (op == "Mul" && per_channel) {
    const std::string base = IsModulePath(cname) ? cname : im.ScopeName(i);
    return im.AddLayer(i, base, "layer_scale", Args(), {im.In(i, xk)}, {{"", c}}, n.output(0));
  }
  im.Fail(i, StrCat(op == "Mul" ? "multiplies" : "divides", " by a constant ", c.shape(),
                    "; cnnflow takes a scalar, or a per-channel [C, 1, 1] scale (layer_scale)"));
}

void ImportConcat(OnnxImporter& im, int i, NodeAttrs& a) {
  const auto& n = im.node(i);
  const int64_t axis = a.Int("axis", 1);
  a.Done();
  if (n.input_size() == 0) im.Fail(i, "has no inputs");
  std::vector<std::string> ins;
  for (int k = 0; k < n.input_size(); ++k) {
    im.ValIn(i, k);  // each a computed value
    ins.push_back(im.In(i, k));
  }
  const int rank = im.Value(ins[0]).shape.rank() + 1;
  if (axis != 1 && axis != 1 - rank)
    im.Fail(i,
            StrCat("concatenates along axis ", axis, "; cnnflow's concat joins channels (axis 1)"));
  if (ins.size() == 1) return im.Alias(i, ins[0]);
  im.AddLayer(i, im.ScopeName(i), "concat", Args(), ins, {}, n.output(0));
}

// Channels [start, end) of input 0 as a channel_slice layer writing `output`.
void AddChannelSlice(OnnxImporter& im, int i, int64_t start, int64_t end,
                     const std::string& output) {
  const int64_t c = im.ValIn(i, 0).shape[0];
  if (!(0 <= start && start < end && end <= c)) {
    im.Fail(i, StrCat("takes channels [", start, ", ", end, ") of ", c));
  }
  Args args;
  args.Set("start", start);
  args.Set("end", end);
  im.AddLayer(i, im.ScopeName(i), "channel_slice", args, {im.In(i, 0)}, {}, output);
}

// Whether ONNX's `axis` of a batched tensor is the channels of samples of
// `rank` dimensions (1, or its negative form).
bool IsChannelAxis(int64_t axis, int rank) { return axis == 1 || axis == 1 - (rank + 1); }

// Slice (opset 10+) of one axis, the channels, step 1: starts and ends
// constants (or shape arithmetic, folded: torch.chunk exports so);
// negative ones count from the end, and both clamp to [0, C].
void ImportSlice(OnnxImporter& im, int i, NodeAttrs& a) {
  a.Done();
  const Val x = im.ValIn(i, 0);
  const std::vector<int64_t> starts = IntsOf(im.ConstIn(i, 1)), ends = IntsOf(im.ConstIn(i, 2));
  const std::vector<int64_t> axes =
      im.HasIn(i, 3) ? IntsOf(im.ConstIn(i, 3)) : std::vector<int64_t>{0};
  const std::vector<int64_t> steps =
      im.HasIn(i, 4) ? IntsOf(im.ConstIn(i, 4)) : std::vector<int64_t>{1};
  if (starts.size() != 1 || ends.size() != 1 || axes.size() != 1 || steps.size() != 1 ||
      !IsChannelAxis(axes[0], x.shape.rank()) || steps[0] != 1) {
    im.Fail(i,
            "slices other than one range of channels with step 1; cnnflow's channel_slice "
            "takes x[:, start:end]");
  }
  const int64_t c = x.shape[0];
  auto clamp = [c](int64_t v) { return std::clamp(v < 0 ? v + c : v, int64_t{0}, c); };
  AddChannelSlice(im, i, clamp(starts[0]), clamp(ends[0]), im.node(i).output(0));
}

// Split along the channels into parts of the given sizes (input 1, opset
// 13+; the `split` attribute before), or equal parts: a channel_slice each.
void ImportSplit(OnnxImporter& im, int i, NodeAttrs& a) {
  const auto& n = im.node(i);
  const int64_t axis = a.Int("axis", 0);
  std::vector<int64_t> sizes = a.Ints("split", {});
  a.Int("num_outputs", 0);  // opset 18: equal parts, as without sizes
  a.Done();
  const Val x = im.ValIn(i, 0);
  if (!IsChannelAxis(axis, x.shape.rank())) im.Fail(i, "splits another axis than the channels");
  if (im.HasIn(i, 1)) sizes = IntsOf(im.ConstIn(i, 1));
  const int64_t c = x.shape[0], parts = n.output_size();
  if (sizes.empty()) {
    if (c % parts != 0)
      im.Fail(i, StrCat(c, " channels do not split into ", parts, " equal parts"));
    sizes.assign(parts, c / parts);
  }
  if (static_cast<int64_t>(sizes.size()) != parts) im.Fail(i, "has as many sizes as outputs");
  int64_t start = 0;
  for (int64_t k = 0; k < parts; ++k) {
    if (!n.output(k).empty()) AddChannelSlice(im, i, start, start + sizes[k], n.output(k));
    start += sizes[k];
  }
  if (start != c) im.Fail(i, StrCat("splits ", c, " channels into parts of ", start, " in all"));
}

void ExportChannelSlice(OnnxExporter& ex, int i) {
  const auto& l = ex.As<ChannelSliceLayer>(i);
  const std::string p = l.name() + "/";
  ex.AddInts(p + "starts", {l.start()});
  ex.AddInts(p + "ends", {l.end()});
  ex.AddInts(p + "axes", {1});
  ex.Node("Slice", i, {ex.In(i), p + "starts", p + "ends", p + "axes"}, ex.Out(i));
}

void ExportAdd(OnnxExporter& ex, int i) {
  ex.Node("Add", i, {ex.In(i, 0), ex.In(i, 1)}, ex.Out(i));
}

void ExportMul(OnnxExporter& ex, int i) {
  const Layer& l = ex.layer(i);
  const auto& m = ex.As<MulLayer>(i);
  if (m.has_scale()) {
    const std::string a = l.name() + "/scale";
    ex.AddInitializer(a, Tensor::Full(Shape{1}, m.scale(), DType::kF32));
    ex.Node("Mul", i, {ex.In(i), a}, ex.Out(i));
  } else {  // s [N, C] for x [N, C, H, W]: unsqueezed, NumPy broadcasting does the rest
    const int sr = ex.InShape(i, 1).rank() + 1, xr = ex.InShape(i, 0).rank() + 1;
    ex.Node("Mul", i, {ex.In(i, 0), ex.Unsqueezed(i, ex.In(i, 1), sr, xr - sr, "s")}, ex.Out(i));
  }
}

void ExportLayerScale(OnnxExporter& ex, int i) {
  const Layer& l = ex.layer(i);
  ex.Node("Mul", i, {ex.In(i), ex.Weight(l, "")}, ex.Out(i));
}

void ExportConcat(OnnxExporter& ex, int i) {
  std::vector<std::string> in;
  for (int k = 0; k < ex.num_inputs(i); ++k) in.push_back(ex.In(i, k));
  ex.Int(ex.Node("Concat", i, in, ex.Out(i)), "axis", 1);
}

}  // namespace

CNNFLOW_ONNX_IMPORT(Add, "add of two computed values", ImportArithmetic);
CNNFLOW_ONNX_IMPORT(Mul, "mul (of two values; by a scalar: mul {scale}; by [C, 1, 1]: layer_scale)",
                    ImportArithmetic);
CNNFLOW_ONNX_IMPORT(Div, "mul {scale: 1 / c} (by a scalar constant)", ImportArithmetic);
CNNFLOW_ONNX_IMPORT(Concat, "concat (axis 1; of constants: folded)", ImportConcat);
CNNFLOW_ONNX_IMPORT(Slice, "channel_slice (one range of channels, step 1)", ImportSlice);
CNNFLOW_ONNX_IMPORT(Split, "a channel_slice per output (along the channels)", ImportSplit);
CNNFLOW_ONNX_EXPORT(add, "Add", ExportAdd);
CNNFLOW_ONNX_EXPORT(channel_slice, "Slice (axis 1)", ExportChannelSlice);
CNNFLOW_ONNX_EXPORT(mul, "Mul (a scale as a [1] initializer; s unsqueezed to x's rank)", ExportMul);
CNNFLOW_ONNX_EXPORT(layer_scale, "Mul by gamma [C, 1, 1]", ExportLayerScale);
CNNFLOW_ONNX_EXPORT(concat, "Concat (axis 1)", ExportConcat);

}  // namespace cnnflow::onnx_io
