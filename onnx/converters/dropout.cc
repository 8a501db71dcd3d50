// Regularisers that are the identity at inference: Dropout -> dropout (p > 0)
// or nothing; dropout and drop_path out as Identity.
#include "onnx/converter.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"

namespace cnnflow::onnx_io {
namespace {

void ImportDropout(OnnxImporter& im, int i, NodeAttrs& a) {
  double p = a.Float("ratio", 0.5);
  a.Int("seed", 0);
  a.Done();
  if (im.HasIn(i, 1)) {
    const auto r = im.ScalarIn(i, 1);
    if (!r) im.Fail(i, "its ratio is not a constant");
    p = Decimal(static_cast<float>(*r));
  }
  if (p <= 0) return im.Alias(i, im.In(i, 0));
  Args args;
  args.Set("p", p);
  im.Simple(i, "dropout", args);
}

void ExportIdentity(OnnxExporter& ex, int i) { ex.Node("Identity", i, {ex.In(i)}, ex.Out(i)); }

}  // namespace

CNNFLOW_ONNX_IMPORT(Dropout, "dropout (p > 0), else nothing", ImportDropout);
CNNFLOW_ONNX_EXPORT(dropout, "Identity (inference)", ExportIdentity);
CNNFLOW_ONNX_EXPORT(drop_path, "Identity (inference)", ExportIdentity);

}  // namespace cnnflow::onnx_io
