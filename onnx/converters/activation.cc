// Activations: Relu, Sigmoid, Tanh, HardSigmoid, HardSwish, LeakyRelu, Gelu
// <-> the layer of that name; Clip [0, 6] / [0, inf) -> relu6 / relu, and
// relu6 out as Clip; silu out as Sigmoid + Mul and gelu out in elementwise
// nodes (opset 17 has no Gelu: x * 0.5 * (1 + Erf(x / sqrt 2)), or the tanh
// form, as torch.onnx writes them). The patterns that import SiLU and GELU
// from those nodes are the importer's (onnx/import_patterns.cc): an Erf
// outside them is an error.
#include "ops/layers/activation.h"

#include <cmath>

#include "onnx/converter.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"

namespace cnnflow::onnx_io {
namespace {

// The import of an op of one input and no attributes as the layer `type`.
auto Plain(const char* type) {
  return [type](OnnxImporter& im, int i, NodeAttrs& a) {
    a.Done();
    im.Simple(i, type);
  };
}

void ImportLeakyRelu(OnnxImporter& im, int i, NodeAttrs& a) {
  Args args;
  args.Set("negative_slope", a.Float("alpha", 0.01));
  a.Done();
  im.Simple(i, "leaky_relu", args);
}

void ImportHardSigmoid(OnnxImporter& im, int i, NodeAttrs& a) {
  const double alpha = a.Float("alpha", 0.2), beta = a.Float("beta", 0.5);
  a.Done();
  if (std::abs(alpha - 1.0 / 6) > 1e-6 || std::abs(beta - 0.5) > 1e-6) {
    im.Fail(i, StrCat("alpha ", alpha, ", beta ", beta,
                      ": cnnflow's hardsigmoid is PyTorch's (alpha 1/6, beta 0.5)"));
  }
  im.Simple(i, "hardsigmoid");
}

void ImportGelu(OnnxImporter& im, int i, NodeAttrs& a) {
  Args args;
  const std::string approx = a.String("approximate", "none");
  a.Done();
  if (approx != "none") args.Set("approximate", approx);
  im.Simple(i, "gelu", args);
}

void ImportClip(OnnxImporter& im, int i, NodeAttrs& a) {
  double lo = a.Float("min", -INFINITY), hi = a.Float("max", INFINITY);  // opset < 11
  a.Done();
  if (im.HasIn(i, 1)) {
    const auto v = im.ScalarIn(i, 1);
    if (!v) im.Fail(i, "its min is not a scalar constant");
    lo = *v;
  }
  if (im.HasIn(i, 2)) {
    const auto v = im.ScalarIn(i, 2);
    if (!v) im.Fail(i, "its max is not a scalar constant");
    hi = *v;
  }
  if (lo == 0 && hi == 6) return im.Simple(i, "relu6");
  if (lo == 0 && std::isinf(hi) && hi > 0) return im.Simple(i, "relu");
  im.Fail(i, StrCat("clips to [", lo, ", ", hi, "]; cnnflow has relu6 [0, 6] and relu [0, inf)"));
}

void ExportRelu(OnnxExporter& ex, int i) { ex.Node("Relu", i, {ex.In(i)}, ex.Out(i)); }

void ExportActivation(OnnxExporter& ex, int i) {
  const auto& l = ex.As<ActivationLayer>(i);
  const std::string x = ex.In(i), c = l.name() + "/";
  switch (l.kind()) {
    case Activation::kGeluErf: {  // x * 0.5 * (1 + Erf(x / sqrt 2))
      const std::string e = ex.Step(
          i, "Erf", {ex.Step(i, "Div", {x, ex.Scalar(c + "sqrt2", 1.41421356f)}, "div")}, "erf");
      const std::string xm =
          ex.Step(i, "Mul", {x, ex.Step(i, "Add", {e, ex.Scalar(c + "one", 1)}, "add")}, "mul");
      ex.Step(i, "Mul", {xm, ex.Scalar(c + "half", 0.5f)}, "half", true);
      return;
    }
    case Activation::kGeluTanh: {  // x * 0.5 * (1 + Tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      const std::string x3 = ex.Step(i, "Mul", {ex.Step(i, "Mul", {x, x}, "sq"), x}, "cube");
      const std::string inner = ex.Step(
          i, "Add", {x, ex.Step(i, "Mul", {x3, ex.Scalar(c + "c", 0.044715f)}, "cubic")}, "inner");
      const std::string t = ex.Step(
          i, "Tanh", {ex.Step(i, "Mul", {inner, ex.Scalar(c + "k", 0.7978845608f)}, "scaled")},
          "tanh");
      const std::string xm =
          ex.Step(i, "Mul", {x, ex.Step(i, "Add", {t, ex.Scalar(c + "one", 1)}, "add")}, "mul");
      ex.Step(i, "Mul", {xm, ex.Scalar(c + "half", 0.5f)}, "half", true);
      return;
    }
    case Activation::kSilu:
      ex.Step(i, "Mul", {x, ex.Step(i, "Sigmoid", {x}, "sigmoid")}, "mul", true);
      return;
    case Activation::kSigmoid:
      ex.Node("Sigmoid", i, {x}, ex.Out(i));
      return;
    case Activation::kTanh:
      ex.Node("Tanh", i, {x}, ex.Out(i));
      return;
    case Activation::kHardsigmoid: {
      onnx::NodeProto* n = ex.Node("HardSigmoid", i, {x}, ex.Out(i));
      ex.Float(n, "alpha", 1.f / 6);
      ex.Float(n, "beta", 0.5f);
      return;
    }
    case Activation::kHardswish:
      ex.Node("HardSwish", i, {x}, ex.Out(i));
      return;
    case Activation::kRelu6:
      ex.Node("Clip", i, {x, ex.Scalar(c + "min", 0), ex.Scalar(c + "max", 6)}, ex.Out(i));
      return;
    case Activation::kLeakyRelu:
      ex.Float(ex.Node("LeakyRelu", i, {x}, ex.Out(i)), "alpha", static_cast<float>(l.alpha()));
      return;
  }
}

}  // namespace

CNNFLOW_ONNX_IMPORT(Relu, "relu", Plain("relu"));
CNNFLOW_ONNX_IMPORT(Sigmoid, "sigmoid (silu with the Mul by its input)", Plain("sigmoid"));
CNNFLOW_ONNX_IMPORT(Tanh, "tanh", Plain("tanh"));
CNNFLOW_ONNX_IMPORT(HardSwish, "hardswish", Plain("hardswish"));
CNNFLOW_ONNX_IMPORT(HardSigmoid, "hardsigmoid (PyTorch's: alpha 1/6, beta 0.5)", ImportHardSigmoid);
CNNFLOW_ONNX_IMPORT(LeakyRelu, "leaky_relu", ImportLeakyRelu);
CNNFLOW_ONNX_IMPORT(Gelu, "gelu (opset 20)", ImportGelu);
CNNFLOW_ONNX_IMPORT(Clip, "relu6 ([0, 6]) or relu ([0, inf))", ImportClip);
CNNFLOW_ONNX_IMPORT(Erf, "only in GELU's pattern: x * 0.5 * (1 + Erf(x / sqrt 2))",
                    [](OnnxImporter& im, int i, NodeAttrs&) {
                      im.Fail(i,
                              "is not part of a GELU (x * 0.5 * (1 + Erf(x / sqrt 2))); cnnflow "
                              "has no erf layer");
                    });
CNNFLOW_ONNX_EXPORT(relu, "Relu", ExportRelu);
CNNFLOW_ONNX_EXPORT(gelu, "x * 0.5 * (1 + Erf(x / sqrt 2)), or the tanh form, elementwise",
                    ExportActivation);
CNNFLOW_ONNX_EXPORT(silu, "Sigmoid + Mul", ExportActivation);
CNNFLOW_ONNX_EXPORT(sigmoid, "Sigmoid", ExportActivation);
CNNFLOW_ONNX_EXPORT(tanh, "Tanh", ExportActivation);
CNNFLOW_ONNX_EXPORT(hardsigmoid, "HardSigmoid (alpha 1/6, beta 0.5)", ExportActivation);
CNNFLOW_ONNX_EXPORT(hardswish, "HardSwish", ExportActivation);
CNNFLOW_ONNX_EXPORT(relu6, "Clip (min 0, max 6)", ExportActivation);
CNNFLOW_ONNX_EXPORT(leaky_relu, "LeakyRelu", ExportActivation);

}  // namespace cnnflow::onnx_io
