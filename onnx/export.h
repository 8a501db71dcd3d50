// ONNX out: a model and its weights as an ONNX model (opset 17), built with
// the ONNX project's own protobuf classes (Debian's libonnx-dev) and checked
// with its model checker and full shape inference. The layer types it
// writes are the export converters' registry (onnx/converter.h; `cnnflow
// stages` lists them).
#pragma once

#include <onnx/onnx_pb.h>

#include <string>

#include "ops/model.h"

namespace cnnflow {

// The ONNX opset cnnflow writes.
constexpr int kOnnxOpset = 17;

struct ExportOptions {
  std::string name;  // the graph's name (the run's)
  std::string doc;   // the model's doc string: where the model and its weights came from
};

// The model as it is, with its current weights (any device): one ONNX node
// or a few per layer, input "input" [N, ...], output "logits" [N, classes].
// Throws Error naming a layer whose type has no export, or a layer split
// over devices (a tensor-parallel shard is not the layer ONNX describes).
onnx::ModelProto ExportModel(const Model& model, const ExportOptions& options);

// Serialises `proto` and writes it to `path` atomically (a temporary file
// renamed over it). Throws Error naming the path.
void WriteOnnx(const onnx::ModelProto& proto, const std::string& path);

}  // namespace cnnflow
