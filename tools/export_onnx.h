// `cnnflow export`: a model and its weights as an ONNX file (opset 17),
// built with the ONNX project's own protobuf classes (Debian's libonnx-dev)
// and checked with its model checker before it is written.
#pragma once

#include <string>
#include <vector>

namespace cnnflow {

// args: the command line after "export". Returns the exit code: 0 ok, 1 an
// error (a layer type ONNX has no export for, named), 2 wrong arguments.
int RunExport(const std::vector<std::string>& args);

}  // namespace cnnflow
