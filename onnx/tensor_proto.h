// ONNX TensorProto values as cnnflow tensors, for the importer.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ops/tensor.h"

namespace cnnflow::onnx_io {

// A TensorProto as a host tensor: floating types as f32, integers as i64.
// Every size is checked against the bytes present before anything is
// allocated, so a hostile file cannot ask for more memory than it holds.
// `where` names the file or node in errors.
Tensor ReadTensor(const onnx::TensorProto& t, const std::string& where);

// The values of a 1-D constant as integers (a shape, axes).
std::vector<int64_t> IntsOf(const Tensor& t);

}  // namespace cnnflow::onnx_io
