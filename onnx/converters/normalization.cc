// Normalisation layers: BatchNormalization <-> batchnorm (running statistics;
// ONNX's momentum weighs the running statistic, PyTorch's the batch's);
// layernorm and groupnorm out only: layernorm as Transpose (channels last)
// -> LayerNormalization (axis -1) -> Transpose, groupnorm as Reshape
// [N, G, -1] -> InstanceNormalization -> Reshape -> Mul, Add
// (GroupNormalization is opset 18).
#include <cmath>

#include "onnx/converter.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"
#include "ops/layers/batch_norm.h"
#include "ops/layers/group_norm.h"
#include "ops/layers/layer_norm.h"

namespace cnnflow::onnx_io {
namespace {

void ImportBatchNorm(OnnxImporter& im, int i, NodeAttrs& a) {
  im.ValIn(i, 0);
  const double eps = a.Float("epsilon", 1e-5);
  const double momentum = a.Float("momentum", 0.9);
  a.Int("training_mode", 0);  // training or inference: cnnflow's layer does both
  if (a.Int("spatial", 1) != 1)
    im.Fail(i, "spatial = 0 (per-position statistics) is not supported");
  a.Int("is_test", 0);  // opset 6
  a.Done();
  if (momentum < 0 || momentum > 1) im.Fail(i, StrCat("momentum ", momentum, " is not in [0, 1]"));
  Args args;
  if (std::abs(eps - 1e-5) > 1e-12) args.Set("eps", eps);
  // ONNX's momentum weighs the running statistic, PyTorch's the batch's.
  const double m = Decimal(static_cast<float>(1 - momentum));
  if (std::abs(m - 0.1) > 1e-7) args.Set("momentum", m);
  im.AddLayer(i, im.WeightName(i, 1, "weight"), "batchnorm", args, {im.In(i, 0)},
              {{"weight", im.ConstIn(i, 1)},
               {"bias", im.ConstIn(i, 2)},
               {"running_mean", im.ConstIn(i, 3)},
               {"running_var", im.ConstIn(i, 4)}},
              im.node(i).output(0));
}

// LayerNormalization over the last axis: the channels of a channels-last
// view (ConvNeXt's nn.LayerNorm after x.permute(0, 2, 3, 1), and
// LayerNorm2d's) or of [N, C] samples: layernorm.
void ImportLayerNorm(OnnxImporter& im, int i, NodeAttrs& a) {
  const Val x = im.ValIn(i, 0);
  const int64_t axis = a.Int("axis", -1);
  const double eps = a.Float("epsilon", 1e-5);
  a.Int("stash_type", 1);  // the statistics' type: cnnflow's are f64 and f32
  a.Done();
  const int64_t rank = x.shape.rank() + 1;
  if (!((x.channels_last || rank == 2) && (axis == -1 || axis == rank - 1))) {
    im.Fail(i,
            "normalises over another axis than the channels (cnnflow's layernorm takes the "
            "channels of [N, C] or of a channels-last view, axis -1)");
  }
  const Tensor& scale = im.ConstIn(i, 1);
  const Tensor bias = im.HasIn(i, 2) ? im.ConstIn(i, 2) : Tensor::Zeros(scale.shape());
  Args args;
  args.Set("eps", eps);
  im.AddLayer(i, im.WeightName(i, 1, "weight"), "layernorm", args, {im.In(i, 0)},
              {{"weight", scale}, {"bias", bias}}, im.node(i).output(0));
}

void ExportBatchNorm(OnnxExporter& ex, int i) {
  const Layer& l = ex.layer(i);
  const auto& bn = ex.As<BatchNormLayer>(i);
  std::string scale = TensorName(l.name(), "weight"), bias = TensorName(l.name(), "bias");
  if (bn.affine()) {
    ex.Weight(l, "weight");
    ex.Weight(l, "bias");
  } else {  // no affine map: scale 1, shift 0
    ex.AddFilled(scale, bn.channels(), 1);
    ex.AddFilled(bias, bn.channels(), 0);
  }
  onnx::NodeProto* n =
      ex.Node("BatchNormalization", i,
              {ex.In(i), scale, bias, ex.Weight(l, "running_mean"), ex.Weight(l, "running_var")},
              ex.Out(i));
  ex.Float(n, "epsilon", static_cast<float>(bn.eps()));
}

void ExportLayerNorm(OnnxExporter& ex, int i) {
  const Layer& l = ex.layer(i);
  const auto& ln = ex.As<LayerNormLayer>(i);
  const auto [w, b] = ex.AffineOrIdentity(l, ln.affine(), ln.channels());
  const int r = ex.InShape(i).rank() + 1;  // with the batch
  if (r == 2) {
    ex.Float(ex.Int(ex.Node("LayerNormalization", i, {ex.In(i), w, b}, ex.Out(i)), "axis", -1),
             "epsilon", static_cast<float>(ln.eps()));
  } else {
    std::vector<int64_t> last = {0}, back = {0, r - 1};  // channels last, and back
    for (int a = 2; a < r; ++a) last.push_back(a);
    last.push_back(1);
    for (int a = 1; a < r - 1; ++a) back.push_back(a);
    const std::string t = l.name() + "/channels_last", n = l.name() + "/normalised";
    ex.Ints(ex.Node("Transpose", i, {ex.In(i)}, t, "/channels_last"), "perm", last);
    ex.Float(ex.Int(ex.Node("LayerNormalization", i, {t, w, b}, n, "/normalise"), "axis", -1),
             "epsilon", static_cast<float>(ln.eps()));
    ex.Ints(ex.Node("Transpose", i, {n}, ex.Out(i)), "perm", back);
  }
}

void ExportGroupNorm(OnnxExporter& ex, int i) {
  const Layer& l = ex.layer(i);
  const auto& gn = ex.As<GroupNormLayer>(i);
  const Shape s = ex.InShape(i);
  const std::string grouped = l.name() + "/grouped", normed = l.name() + "/normalised";
  const std::string ones = l.name() + "/ones", zeros = l.name() + "/zeros";
  ex.AddInts(grouped + "_shape", {0, gn.groups(), -1});
  ex.Node("Reshape", i, {ex.In(i), grouped + "_shape"}, grouped, "/group");
  ex.AddFilled(ones, gn.groups(), 1);
  ex.AddFilled(zeros, gn.groups(), 0);
  ex.Float(ex.Node("InstanceNormalization", i, {grouped, ones, zeros}, normed, "/normalise"),
           "epsilon", static_cast<float>(gn.eps()));
  std::vector<int64_t> shape = {0};
  for (int64_t d : s.dims()) shape.push_back(d);
  const std::string back = gn.affine() ? l.name() + "/ungrouped" : ex.Out(i);
  ex.AddInts(l.name() + "/ungrouped_shape", shape);
  ex.Node("Reshape", i, {normed, l.name() + "/ungrouped_shape"}, back, "/ungroup");
  if (gn.affine()) {
    const int extra = s.rank() - 1;  // [C] -> [C, 1, 1]
    const std::string scaled = l.name() + "/scaled";
    ex.Node("Mul", i, {back, ex.Unsqueezed(i, ex.Weight(l, "weight"), 1, extra, "weight")}, scaled,
            "/scale");
    ex.Node("Add", i, {scaled, ex.Unsqueezed(i, ex.Weight(l, "bias"), 1, extra, "bias")},
            ex.Out(i));
  }
}

}  // namespace

CNNFLOW_ONNX_IMPORT(BatchNormalization, "batchnorm (training or inference mode)", ImportBatchNorm);
CNNFLOW_ONNX_IMPORT(LayerNormalization,
                    "layernorm (over the channels of [N, C] or of a channels-last view)",
                    ImportLayerNorm);
CNNFLOW_ONNX_EXPORT(batchnorm, "BatchNormalization (running statistics, epsilon)", ExportBatchNorm);
CNNFLOW_ONNX_EXPORT(layernorm, "Transpose -> LayerNormalization (axis -1) -> Transpose",
                    ExportLayerNorm);
CNNFLOW_ONNX_EXPORT(groupnorm, "Reshape -> InstanceNormalization -> Reshape -> Mul, Add",
                    ExportGroupNorm);

}  // namespace cnnflow::onnx_io
