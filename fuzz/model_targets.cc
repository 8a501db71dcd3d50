// The fuzz entry of the ONNX importer (fuzz_targets.h): it maps nodes onto
// the registered layers and builds them, so it links the whole project.
#include "fuzz/fuzz_targets.h"
#include "onnx/import.h"
#include "ops/model.h"

namespace cnnflow::fuzz {

// An ONNX file, as `cnnflow import FILE` reads it: parsed, mapped onto
// layers (each built and its tensors checked), written out as a config,
// and the model built and loaded strictly from the imported tensors.
void FuzzOnnxImport(const uint8_t* data, size_t size) {
  const ImportedOnnx m = ImportOnnx(data, size, "input.onnx");
  (void)ImportedConfig(m, "input.onnx", {}, {});
  auto model = Model::Build(m.layers, m.input_shape);
  LoadStateDict(m.tensors, {model.get()}, {}, "the import");
}

}  // namespace cnnflow::fuzz
