// ONNX converters: how to add one.
//
// A converter maps one family of ops both ways and lives in its own file,
// onnx/converters/<family>.cc, registered in two tables (ops/registry.h):
//   - the import of an ONNX op (the key: its op_type, domain ai.onnx), a
//     function of the importer's context and the node (onnx/importer.h);
//   - the export of a cnnflow layer type (the key: the type), a function of
//     the exporter's context and the layer (onnx/exporter.h), or a
//     declaration that the type has no export and why.
// The registries are the lists: the importer's "it maps: ..." and the
// exporter's "exportable: ..." messages and `cnnflow stages` print their
// names, and ctest cli.house fails for a layer type with neither an export
// nor a declaration.
//
//   CNNFLOW_ONNX_IMPORT(Conv, "conv1d / conv2d (symmetric pads)",
//                       [](OnnxImporter& im, int node, NodeAttrs& a) { ... });
//   CNNFLOW_ONNX_EXPORT(conv2d, "Conv", [](OnnxExporter& ex, int layer) { ... });
//   CNNFLOW_ONNX_NOT_EXPORTABLE(some_type, "why");
#pragma once

#include <functional>
#include <string>

#include "ops/registry.h"
#include "ops/schema.h"

namespace cnnflow::onnx_io {

class NodeAttrs;
class OnnxImporter;
class OnnxExporter;

// The import of an ONNX op: adds the layer(s) of node `node` to the
// importer, or fails naming the node.
struct OnnxImport {
  static constexpr const char* kKind = "ONNX op";
  Schema schema;  // its doc: the cnnflow layer the op becomes
  std::function<void(OnnxImporter& im, int node, NodeAttrs& attrs)> convert;
};

// The export of a layer type: adds the ONNX nodes of layer `layer`. Empty
// `convert`: the type is declared not exportable; the doc says why.
struct OnnxExport {
  static constexpr const char* kKind = "ONNX export of layer type";
  Schema schema;  // its doc: the ONNX nodes it writes, or why it has none
  std::function<void(OnnxExporter& ex, int layer)> convert;
};

using OnnxImportRegistry = Registry<OnnxImport>;
using OnnxExportRegistry = Registry<OnnxExport>;

// The registered names joined by ", " (the ops the importer maps, the layer
// types with an export).
std::string ImportableOps();
std::string ExportableTypes();

}  // namespace cnnflow::onnx_io

#define CNNFLOW_ONNX_IMPORT(op, doc, ...)                                                \
  static ::cnnflow::RegisterIn<::cnnflow::onnx_io::OnnxImport> cnnflow_onnx_import_##op( \
      #op, {::cnnflow::Schema(doc), __VA_ARGS__})

#define CNNFLOW_ONNX_EXPORT(type_name, doc, ...)                                                \
  static ::cnnflow::RegisterIn<::cnnflow::onnx_io::OnnxExport> cnnflow_onnx_export_##type_name( \
      #type_name, {::cnnflow::Schema(doc), __VA_ARGS__})

#define CNNFLOW_ONNX_NOT_EXPORTABLE(type_name, why)                                             \
  static ::cnnflow::RegisterIn<::cnnflow::onnx_io::OnnxExport> cnnflow_onnx_export_##type_name( \
      #type_name, {::cnnflow::Schema(why), nullptr})
