// ONNX in: a network exported from PyTorch (or any ONNX file of the ops
// cnnflow's layers cover) as cnnflow layers and their weights, and as a run
// config (model.yaml) with its weights (model.safetensors, by PyTorch's
// state_dict names where the ONNX initializers carry them). The ops it maps
// are the import converters' registry (onnx/converter.h; `cnnflow stages`
// lists them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/model.h"

namespace cnnflow {

struct ImportedOnnx {
  std::string name;    // the graph's name, or the file's stem
  std::string source;  // "pytorch 2.15.0, opset 17"
  Shape input_shape;   // per sample: [C, H, W] or [C, L]
  int64_t classes = 0;
  int onnx_nodes = 0;
  std::vector<LayerSpec> layers;
  // By model tensor name ("layer1.0.conv1.weight"), f32.
  std::vector<std::pair<std::string, Tensor>> tensors;
  // What the import changed on the way, one line each (a dropped final
  // Softmax, a weight used by two nodes copied).
  std::vector<std::string> notes;
};

// Maps the ONNX model in `bytes` onto cnnflow layers; `what` names it in
// errors (the file). Every layer is built as it is mapped, so a shape or a
// weight that does not fit is an error naming the ONNX node. Throws Error:
// not an ONNX model, an op or attribute with no cnnflow layer (naming the
// node, its op and the ops it knows), a tensor it cannot read.
ImportedOnnx ImportOnnx(const void* bytes, size_t size, const std::string& what);

// The run config of an imported model: the model section, a synthetic data
// section of the input's shape, a minimal train section (train.init: the
// weights beside it) and a comment that says what to replace. `mean` and
// `std` (empty: none) become a normalize transform.
std::string ImportedConfig(const ImportedOnnx& m, const std::string& onnx_path,
                           const std::vector<double>& mean, const std::vector<double>& std);

// Writes DIR/model.yaml (`config`) and DIR/model.safetensors (m's tensors)
// whole or not at all: into a temporary folder beside DIR, checked by
// loading it as `cnnflow train` would (the config parsed, the model built,
// the weights read strictly), then renamed to DIR. DIR must not exist or be
// an empty folder.
void WriteImported(const ImportedOnnx& m, const std::string& config, const std::string& dir);

}  // namespace cnnflow
