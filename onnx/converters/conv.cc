// Convolutions: Conv <-> conv1d, conv2d (symmetric pads; auto_pad where it
// is), ConvTranspose <-> conv_transpose2d (the same weight layout as
// PyTorch's).
#include "onnx/converter.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"
#include "ops/layers/conv1d.h"
#include "ops/layers/conv2d.h"
#include "ops/layers/conv_transpose2d.h"

namespace cnnflow::onnx_io {
namespace {

void ImportConv(OnnxImporter& im, int i, NodeAttrs& a) {
  const Val x = im.ValIn(i, 0);
  const Tensor& w = im.ConstIn(i, 1);
  const int s = w.shape().rank() - 2;
  if ((s != 1 && s != 2) || x.shape.rank() != s + 1) {
    im.Fail(i, StrCat("a weight ", w.shape(), " on samples ", x.shape,
                      ": cnnflow has conv1d and conv2d"));
  }
  std::vector<int64_t> k(w.shape().dims().begin() + 2, w.shape().dims().end());
  const Window win = im.ReadWindow(i, a, s, k, x.shape);
  const int64_t groups = a.Int("group", 1);
  a.Done();
  // Checked before the layer is built: its weight's size comes from the input.
  if (groups < 1 || groups > x.shape[0] || x.shape[0] != w.shape()[1] * groups) {
    im.Fail(i, StrCat("a weight ", w.shape(), " in ", groups, " groups does not fit ", x.shape[0],
                      " input channels"));
  }
  Args args;
  args.Set("out", w.shape()[0]);
  args.Set("kernel", k[0] == k.back() ? ParamValue(k[0]) : ParamValue(k));
  SetInts(args, "stride", win.stride, 1);
  SetInts(args, "pad", win.pad, 0);
  SetInts(args, "dilation", win.dilation, 1);
  if (groups != 1) args.Set("groups", groups);
  const auto t = WeightAndBias(w, im.HasIn(i, 2) ? &im.ConstIn(i, 2) : nullptr, args);
  im.AddLayer(i, im.WeightName(i, 1, "weight"), s == 2 ? "conv2d" : "conv1d", args, {im.In(i, 0)},
              t, im.node(i).output(0));
}

void ImportConvTranspose(OnnxImporter& im, int i, NodeAttrs& a) {
  const Val x = im.ValIn(i, 0);
  const Tensor& w = im.ConstIn(i, 1);
  if (w.shape().rank() != 4 || x.shape.rank() != 3) im.Fail(i, "cnnflow has conv_transpose2d only");
  std::vector<int64_t> k = {w.shape()[2], w.shape()[3]};
  const Window win = im.ReadWindow(i, a, 2, k, x.shape);
  const int64_t groups = a.Int("group", 1);
  if (groups < 1 || groups > x.shape[0] || x.shape[0] != w.shape()[0]) {
    im.Fail(i, StrCat("a weight ", w.shape(), " does not fit ", x.shape[0], " input channels"));
  }
  const std::vector<int64_t> output_pad = a.Ints("output_padding", {0, 0});
  if (a.Has("output_shape"))
    im.Fail(i, "output_shape is not supported (give pads and output_padding)");
  a.Done();
  if (output_pad.size() != 2 || std::any_of(output_pad.begin(), output_pad.end(),
                                            [](int64_t p) { return p < 0 || p > (1 << 20); })) {
    im.Fail(i, "output_padding needs two values of sensible size");
  }
  Args args;
  args.Set("out", w.shape()[1] * groups);
  args.Set("kernel", k[0] == k[1] ? ParamValue(k[0]) : ParamValue(k));
  SetInts(args, "stride", win.stride, 1);
  SetInts(args, "pad", win.pad, 0);
  SetInts(args, "output_pad", output_pad, 0);
  SetInts(args, "dilation", win.dilation, 1);
  if (groups != 1) args.Set("groups", groups);
  const auto t = WeightAndBias(w, im.HasIn(i, 2) ? &im.ConstIn(i, 2) : nullptr, args);
  im.AddLayer(i, im.WeightName(i, 1, "weight"), "conv_transpose2d", args, {im.In(i, 0)}, t,
              im.node(i).output(0));
}

void ExportConv(OnnxExporter& ex, int i) {
  const Layer& l = ex.layer(i);
  const std::string type = l.type();
  const Conv2dGeometry& g = ex.As<Conv2d>(i).geometry();
  std::vector<std::string> in = {ex.In(i), ex.Weight(l, "weight")};
  if (ex.As<Conv2d>(i).has_bias()) in.push_back(ex.Weight(l, "bias"));
  onnx::NodeProto* n = ex.Node("Conv", i, in, ex.Out(i));
  if (type == "conv1d") {  // a [C, 1, L] conv with a 1 x k kernel inside cnnflow
    ex.Ints(n, "kernel_shape", {g.kernel_w});
    ex.Ints(n, "strides", {g.stride_w});
    ex.Ints(n, "pads", {g.pad_w, g.pad_w});
    ex.Ints(n, "dilations", {g.dilation_w});
  } else {
    ex.Ints(n, "kernel_shape", {g.kernel_h, g.kernel_w});
    ex.Ints(n, "strides", {g.stride_h, g.stride_w});
    ex.Ints(n, "pads", {g.pad_h, g.pad_w, g.pad_h, g.pad_w});
    ex.Ints(n, "dilations", {g.dilation_h, g.dilation_w});
  }
  ex.Int(n, "group", g.groups);
}

void ExportConvTranspose(OnnxExporter& ex, int i) {
  const Layer& l = ex.layer(i);
  const auto& ct = ex.As<ConvTranspose2d>(i);
  const Conv2dGeometry& g = ct.dual();
  std::vector<std::string> in = {ex.In(i), ex.Weight(l, "weight")};
  if (ct.has_bias()) in.push_back(ex.Weight(l, "bias"));
  onnx::NodeProto* n = ex.Node("ConvTranspose", i, in, ex.Out(i));
  ex.Ints(n, "kernel_shape", {g.kernel_h, g.kernel_w});
  ex.Ints(n, "strides", {g.stride_h, g.stride_w});
  ex.Ints(n, "pads", {g.pad_h, g.pad_w, g.pad_h, g.pad_w});
  ex.Ints(n, "dilations", {g.dilation_h, g.dilation_w});
  ex.Ints(n, "output_padding", {ct.output_pad_h(), ct.output_pad_w()});
  ex.Int(n, "group", g.groups);
}

}  // namespace

CNNFLOW_ONNX_IMPORT(Conv, "conv1d or conv2d (groups, dilation; symmetric pads, auto_pad)",
                    ImportConv);
CNNFLOW_ONNX_IMPORT(ConvTranspose, "conv_transpose2d (output_padding; no output_shape)",
                    ImportConvTranspose);
CNNFLOW_ONNX_EXPORT(conv1d, "Conv (kernel_shape, strides, pads, dilations, group)", ExportConv);
CNNFLOW_ONNX_EXPORT(conv2d, "Conv (kernel_shape, strides, pads, dilations, group)", ExportConv);
CNNFLOW_ONNX_EXPORT(conv_transpose2d, "ConvTranspose (output_padding, group)", ExportConvTranspose);

}  // namespace cnnflow::onnx_io
