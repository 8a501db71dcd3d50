// `cnnflow import MODEL.onnx -o DIR`: a network in ONNX as a cnnflow run
// config (DIR/model.yaml) and its weights (DIR/model.safetensors); the
// import itself is the ONNX library's (onnx/import.h).
#pragma once

#include <string>
#include <vector>

namespace cnnflow {

// args: the command line after "import". Returns the exit code: 0 ok, 1 an
// error, 2 wrong arguments.
int RunImport(const std::vector<std::string>& args);

}  // namespace cnnflow
