#include "onnx/export.h"

#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>

#include "onnx/exporter.h"
#include "ops/error.h"
#include "ops/io/file_write.h"

namespace cnnflow {

onnx::ModelProto ExportModel(const Model& model, const ExportOptions& options) {
  onnx::ModelProto proto = onnx_io::OnnxExporter(model, options.name).Build();
  if (!options.doc.empty()) proto.set_doc_string(options.doc);
  onnx::checker::check_model(proto);
  onnx::shape_inference::InferShapes(proto, onnx::OpSchemaRegistry::Instance(),
                                     onnx::ShapeInferenceOptions(true, 1, true));
  return proto;
}

void WriteOnnx(const onnx::ModelProto& proto, const std::string& path) {
  std::string bytes;
  if (!proto.SerializeToString(&bytes))
    throw Error(StrCat(path, ": cannot serialise the ONNX model"));
  WriteFileAtomically(path, bytes);
}

}  // namespace cnnflow
