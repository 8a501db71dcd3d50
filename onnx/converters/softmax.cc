// Softmax and LogSoftmax: dropped where they are the model's last op.
#include "onnx/converter.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"

namespace cnnflow::onnx_io {
namespace {

// cnnflow's loss and predict apply the softmax to the logits, so a final
// Softmax is dropped (said in a note); anywhere else it has no layer.
void ImportSoftmax(OnnxImporter& im, int i, NodeAttrs& a) {
  const auto& n = im.node(i);
  a.Int("axis", -1);
  a.Done();
  if (n.output(0) != im.output())
    im.Fail(i, "is not the model's last op; cnnflow has no softmax layer");
  im.Note(StrCat(im.Where(i), ": the final ", n.op_type(),
                 " is left out: cnnflow's loss and predict apply the softmax to the logits"));
  im.SetOutput(im.In(i, 0));
  im.Alias(i, im.In(i, 0));
}

}  // namespace

CNNFLOW_ONNX_IMPORT(Softmax, "dropped where it is the last op", ImportSoftmax);
CNNFLOW_ONNX_IMPORT(LogSoftmax, "dropped where it is the last op", ImportSoftmax);

}  // namespace cnnflow::onnx_io
