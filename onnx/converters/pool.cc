// Pooling: MaxPool, AveragePool <-> maxpool*d, avgpool*d (count_include_pad;
// ceil_mode in 2D, and in 1D where it changes nothing); GlobalAveragePool and a spatial
// ReduceMean -> global_avgpool when a Flatten follows, else
// adaptive_avgpool*d {out: 1}; global_avgpool out as GlobalAveragePool +
// Flatten; adaptive_avgpool*d out as GlobalAveragePool (out 1) or an
// AveragePool with kernel = stride = in / out (out dividing in): other sizes
// have overlapping bins of varying size that no ONNX pooling expresses.
#include <algorithm>

#include "onnx/converter.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"
#include "onnx/tensor_proto.h"
#include "ops/layers/adaptive_pool.h"
#include "ops/layers/pooling.h"
#include "ops/layers/pooling1d.h"

namespace cnnflow::onnx_io {
namespace {

void ImportPool(OnnxImporter& im, int i, NodeAttrs& a) {
  const Val x = im.ValIn(i, 0);
  const bool max = im.node(i).op_type() == "MaxPool";
  const int s = x.shape.rank() - 1;
  if (s != 1 && s != 2)
    im.Fail(i, StrCat("pools samples ", x.shape, ": cnnflow pools [C, L] and [C, H, W]"));
  const Window w = im.ReadWindow(i, a, s, {}, x.shape);
  const int64_t ceil_mode = a.Int("ceil_mode", 0);
  bool count_include_pad = false;
  if (max) {
    if (a.Int("storage_order", 0) != 0) im.Fail(i, "storage_order 1 is not supported");
    if (im.node(i).output_size() > 1 && !im.node(i).output(1).empty() &&
        im.IsRead(im.node(i).output(1))) {
      im.Fail(i, "its indices output is used; cnnflow's max pooling has none");
    }
  } else {
    count_include_pad = a.Int("count_include_pad", 0) != 0;
  }
  a.Done();
  bool rounds_up = false;  // ceil_mode changes the output size
  for (int d = 0; d < s; ++d) {
    if (w.dilation[d] != 1) im.Fail(i, "dilated pooling is not supported");
    rounds_up |= ceil_mode && (x.shape[d + 1] + 2 * w.pad[d] - w.kernel[d]) % w.stride[d] != 0;
  }
  if (rounds_up && s == 1) {
    im.Fail(i, "ceil_mode = 1 gives a larger output than cnnflow's 1D pooling (floor) here");
  }
  Args args;
  if (rounds_up) args.Set("ceil_mode", true);
  args.Set("kernel",
           w.kernel[0] == w.kernel.back() ? ParamValue(w.kernel[0]) : ParamValue(w.kernel));
  args.Set("stride",
           w.stride[0] == w.stride.back() ? ParamValue(w.stride[0]) : ParamValue(w.stride));
  SetInts(args, "pad", w.pad, 0);
  if (!max && !count_include_pad &&
      std::any_of(w.pad.begin(), w.pad.end(), [](int64_t p) { return p > 0; })) {
    args.Set("count_include_pad", false);
  }
  im.Simple(i, StrCat(max ? "maxpool" : "avgpool", s, "d"), args);
}

// The mean over the positions: global_avgpool [C] when a flatten is the
// only reader (or keep_dims is false), else adaptive_avgpool {out: 1}.
void AddGlobalPool(OnnxImporter& im, int i, const std::string& x, bool keep_dims) {
  const Val v = im.ValIn(i, 0);
  if (v.shape.rank() < 2) im.Fail(i, "pools a flat sample");
  std::string output = im.node(i).output(0);
  const int f = im.SoleReader(output);
  if (keep_dims && im.IsFlatten(f, Shape{v.shape[0]})) {
    im.Skip(f);
    output = im.node(f).output(0);
    keep_dims = false;
  }
  if (!keep_dims) return im.AddLayer(i, im.ScopeName(i), "global_avgpool", Args(), {x}, {}, output);
  Args args;
  args.Set("out", int64_t{1});
  im.AddLayer(i, im.ScopeName(i), v.shape.rank() == 3 ? "adaptive_avgpool2d" : "adaptive_avgpool1d",
              args, {x}, {}, output);
}

void ImportGlobalAveragePool(OnnxImporter& im, int i, NodeAttrs& a) {
  a.Done();
  AddGlobalPool(im, i, im.In(i, 0), true);
}

void ImportReduceMean(OnnxImporter& im, int i, NodeAttrs& a) {
  const Val x = im.ValIn(i, 0);
  std::vector<int64_t> axes = a.Ints("axes", {});
  const int64_t keep = a.Int("keepdims", 1);
  a.Int("noop_with_empty_axes", 0);  // opset 18: the axes are given below
  a.Done();
  if (im.HasIn(i, 1)) axes = IntsOf(im.ConstIn(i, 1));  // opset 18
  const int rank = x.shape.rank() + 1;
  for (int64_t& ax : axes) ax = ax < 0 ? ax + rank : ax;
  std::sort(axes.begin(), axes.end());
  std::vector<int64_t> spatial;
  for (int d = 2; d < rank; ++d) spatial.push_back(d);
  if (axes != spatial)
    im.Fail(i, "a mean over other axes than all the spatial ones has no cnnflow layer");
  AddGlobalPool(im, i, im.In(i, 0), keep != 0);
}

void ExportPool2d(OnnxExporter& ex, int i) {
  const Layer& l = ex.layer(i);
  const std::string type = l.type();
  const Pool2dGeometry& g = ex.As<Pool2dBase>(i).geometry();
  onnx::NodeProto* n =
      ex.Node(type == "maxpool2d" ? "MaxPool" : "AveragePool", i, {ex.In(i)}, ex.Out(i));
  ex.Ints(n, "kernel_shape", {g.kernel_h, g.kernel_w});
  ex.Ints(n, "strides", {g.stride_h, g.stride_w});
  ex.Ints(n, "pads", {g.pad_h, g.pad_w, g.pad_h, g.pad_w});
  if (type == "avgpool2d") ex.Int(n, "count_include_pad", ex.As<AvgPool2d>(i).count_include_pad());
  if (!g.WindowsInside()) ex.Int(n, "ceil_mode", 1);  // a ceil_mode size that rounded up
}

void ExportPool1d(OnnxExporter& ex, int i) {
  const Layer& l = ex.layer(i);
  const std::string type = l.type();
  const Pool1dGeometry& g = ex.As<Pool1dBase>(i).geometry();
  onnx::NodeProto* n =
      ex.Node(type == "maxpool1d" ? "MaxPool" : "AveragePool", i, {ex.In(i)}, ex.Out(i));
  ex.Ints(n, "kernel_shape", {g.kernel});
  ex.Ints(n, "strides", {g.stride});
  ex.Ints(n, "pads", {g.pad, g.pad});
  if (type == "avgpool1d") ex.Int(n, "count_include_pad", ex.As<AvgPool1d>(i).count_include_pad());
}

void ExportGlobalAvgPool(OnnxExporter& ex, int i) {
  const Layer& l = ex.layer(i);
  const std::string pooled = l.name() + "/pooled";
  ex.Node("GlobalAveragePool", i, {ex.In(i)}, pooled);
  ex.Int(ex.Node("Flatten", i, {pooled}, ex.Out(i), "/flatten"), "axis", 1);
}

// GlobalAveragePool (out 1 everywhere) or AveragePool with kernel =
// stride = in / out (out divides in): then the bins are exactly those
// windows. Other sizes have overlapping bins of varying size that no
// ONNX pooling expresses.
void ExportAdaptivePool(OnnxExporter& ex, int i) {
  const auto& l = ex.As<AdaptiveAvgPool>(i);
  const AdaptivePoolGeometry& g = l.geometry();
  const bool two = l.rank() == 3;
  if (g.out_h == 1 && g.out_w == 1) {
    ex.Node("GlobalAveragePool", i, {ex.In(i)}, ex.Out(i));
    return;
  }
  if (g.in_h % g.out_h != 0 || g.in_w % g.out_w != 0) {
    throw Error(StrCat("layer '", l.name(), "' (", l.type(), ") has no ONNX export for input ",
                       two ? StrCat(g.in_h, "x", g.in_w) : StrCat(g.in_w), " -> output ",
                       two ? StrCat(g.out_h, "x", g.out_w) : StrCat(g.out_w),
                       ": the output size must divide the input size (an AveragePool) or be "
                       "1 (a GlobalAveragePool)"));
  }
  onnx::NodeProto* n = ex.Node("AveragePool", i, {ex.In(i)}, ex.Out(i));
  const int64_t kh = g.in_h / g.out_h, kw = g.in_w / g.out_w;
  if (two) {
    ex.Ints(n, "kernel_shape", {kh, kw});
    ex.Ints(n, "strides", {kh, kw});
  } else {
    ex.Ints(n, "kernel_shape", {kw});
    ex.Ints(n, "strides", {kw});
  }
}

}  // namespace

CNNFLOW_ONNX_IMPORT(MaxPool, "maxpool1d or maxpool2d (ceil_mode: 2D)", ImportPool);
CNNFLOW_ONNX_IMPORT(AveragePool, "avgpool1d or avgpool2d (count_include_pad; ceil_mode: 2D)",
                    ImportPool);
CNNFLOW_ONNX_IMPORT(GlobalAveragePool,
                    "global_avgpool when a Flatten follows, else adaptive_avgpool*d {out: 1}",
                    ImportGlobalAveragePool);
CNNFLOW_ONNX_IMPORT(ReduceMean, "over all the spatial axes: as GlobalAveragePool",
                    ImportReduceMean);
CNNFLOW_ONNX_EXPORT(maxpool2d, "MaxPool (ceil_mode)", ExportPool2d);
CNNFLOW_ONNX_EXPORT(avgpool2d, "AveragePool (count_include_pad)", ExportPool2d);
CNNFLOW_ONNX_EXPORT(maxpool1d, "MaxPool", ExportPool1d);
CNNFLOW_ONNX_EXPORT(avgpool1d, "AveragePool (count_include_pad)", ExportPool1d);
CNNFLOW_ONNX_EXPORT(global_avgpool, "GlobalAveragePool + Flatten: [N, C, ...] -> [N, C]",
                    ExportGlobalAvgPool);
CNNFLOW_ONNX_EXPORT(adaptive_avgpool1d, "GlobalAveragePool (out 1) or AveragePool (out divides in)",
                    ExportAdaptivePool);
CNNFLOW_ONNX_EXPORT(adaptive_avgpool2d, "GlobalAveragePool (out 1) or AveragePool (out divides in)",
                    ExportAdaptivePool);

}  // namespace cnnflow::onnx_io
