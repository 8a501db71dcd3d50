// Linear maps: Gemm, MatMul (+ the Add of its bias) <-> linear (a [in, out]
// weight transposed); MatMul over a channels-last view's channels ->
// channel_linear; channel_linear out as a Conv with a 1x1 kernel (the
// weight [K, C] unsqueezed to [K, C, 1, 1]; Gemm for [C] samples): one node
// every runtime runs as a GEMM, where Transpose -> MatMul -> Add ->
// Transpose would be four.
#include "onnx/converter.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"
#include "ops/layers/channel_linear.h"

namespace cnnflow::onnx_io {
namespace {

// A linear layer of weight w [out, in] (and bias b) reading value x:
// `linear` on flat samples [N, in], or `channel_linear` over the channels
// of a channels-last view (ConvNeXt's nn.Linear on x.permute(0, 2, 3, 1)).
void AddLinear(OnnxImporter& im, int i, const std::string& base, const std::string& x,
               const Tensor& w, const Tensor* b, const std::string& output) {
  const Val& in = im.Value(x);
  if (in.shape.rank() != 1 && !in.channels_last) {
    im.Fail(i, StrCat("a matrix product of samples ", in.shape,
                      ": cnnflow's linear takes [N, features] (or the channels of a "
                      "channels-last view)"));
  }
  if (w.shape().rank() != 2 || w.shape()[1] != in.shape[0]) {
    im.Fail(i, StrCat("a weight ", w.shape(), " does not fit ", in.shape[0], " input features"));
  }
  Args args;
  args.Set("out", w.shape()[0]);
  const auto t = WeightAndBias(w, b, args);
  im.AddLayer(i, base, in.channels_last ? "channel_linear" : "linear", args, {x}, t, output);
}

void ImportGemm(OnnxImporter& im, int i, NodeAttrs& a) {
  im.ValIn(i, 0);
  const Tensor& bm = im.ConstIn(i, 1);
  const double alpha = a.Float("alpha", 1), beta = a.Float("beta", 1);
  const int64_t trans_a = a.Int("transA", 0), trans_b = a.Int("transB", 0);
  a.Done();
  if (alpha != 1 || (beta != 1 && im.HasIn(i, 2)) || trans_a != 0 || bm.shape().rank() != 2) {
    im.Fail(i, "only y = x W^T + b (alpha 1, beta 1, transA 0, a 2-D weight) is a cnnflow linear");
  }
  const Tensor w = trans_b ? bm : Transposed(bm);
  const Tensor* b = im.HasIn(i, 2) ? &im.ConstIn(i, 2) : nullptr;
  AddLinear(im, i, im.WeightName(i, 1, "weight"), im.In(i, 0), w, b, im.node(i).output(0));
}

// x [N, in] @ W [in, out] (or over a channels-last view's channels), with
// the bias of an Add that follows.
void ImportMatMul(OnnxImporter& im, int i, NodeAttrs& a) {
  a.Done();
  im.ValIn(i, 0);
  const Tensor& bm = im.ConstIn(i, 1);
  if (bm.shape().rank() != 2) im.Fail(i, "only x @ W with a 2-D constant W is a cnnflow linear");
  const Tensor w = Transposed(bm);
  std::string output = im.node(i).output(0);
  const Tensor* b = nullptr;
  std::string base = im.ScopeName(i);
  const int add = im.SoleReader(output);
  if (im.IsBinary(add, "Add")) {
    const int k = im.node(add).input(0) == output ? 1 : 0;
    const std::string& bias = im.node(add).input(k);
    if (im.IsConst(bias) && im.Const(bias).numel() == w.shape()[0]) {
      b = &im.Const(bias);
      if (IsModulePath(bias) && EndsWith(bias, ".bias")) base = bias.substr(0, bias.size() - 5);
      im.Skip(add);
      output = im.node(add).output(0);
    }
  }
  AddLinear(im, i, base, im.In(i, 0), w, b, output);
}

void ExportLinear(OnnxExporter& ex, int i) {
  const Layer& l = ex.layer(i);
  std::string x = ex.In(i);
  if (ex.InShape(i).rank() > 1) {  // cnnflow's linear flattens a sample; Gemm takes [N, F]
    x = l.name() + "/flat";
    ex.Int(ex.Node("Flatten", i, {ex.In(i)}, x, "/flatten"), "axis", 1);
  }
  std::vector<std::string> in = {x, ex.Weight(l, "weight")};
  bool bias = false;
  for (const Parameter& p : l.parameters()) bias = bias || p.name == "bias";
  if (bias) in.push_back(ex.Weight(l, "bias"));
  ex.Int(ex.Node("Gemm", i, in, ex.Out(i)), "transB", 1);
}

void ExportChannelLinear(OnnxExporter& ex, int i) {
  const Layer& l = ex.layer(i);
  const auto& cl = ex.As<ChannelLinearLayer>(i);
  std::vector<std::string> in = {ex.In(i), ex.Weight(l, "weight")};
  if (cl.has_bias()) in.push_back(ex.Weight(l, "bias"));
  const int spatial = ex.InShape(i).rank() - 1;
  if (spatial == 0) {  // [C] samples: nn.Linear itself
    ex.Int(ex.Node("Gemm", i, in, ex.Out(i)), "transB", 1);
  } else {
    in[1] = ex.Unsqueezed(i, in[1], 2, spatial, "kernel");
    ex.Ints(ex.Node("Conv", i, in, ex.Out(i)), "kernel_shape", std::vector<int64_t>(spatial, 1));
  }
}

}  // namespace

CNNFLOW_ONNX_IMPORT(Gemm, "linear (y = x W^T + b: alpha 1, beta 1, transA 0)", ImportGemm);
CNNFLOW_ONNX_IMPORT(MatMul,
                    "linear (x @ W with a constant 2-D W, and the bias of an Add after); over a "
                    "channels-last view's channels: channel_linear",
                    ImportMatMul);
CNNFLOW_ONNX_EXPORT(linear, "Gemm (transB 1), after a Flatten for samples of several dimensions",
                    ExportLinear);
CNNFLOW_ONNX_EXPORT(channel_linear, "Conv with a 1x1 kernel (Gemm for [C] samples)",
                    ExportChannelLinear);

}  // namespace cnnflow::onnx_io
