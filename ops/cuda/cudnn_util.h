// Helpers shared by the cuDNN layers (ops/cuda/conv_cudnn.cc,
// pooling_cudnn.cc, batch_norm_cudnn.cc): the cuDNN type of a tensor's
// dtype, checked int dimensions, a layer's label for messages, and the
// host-side pieces the tests check without a GPU (PickCudnnAlgo,
// BatchNormCudnnDims). Compiled only with CUDA.
#pragma once

#include <cudnn.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/dtype.h"
#include "ops/error.h"
#include "ops/layer.h"

namespace cnnflow::detail {

// alpha = 1, beta = 0 / 1 of cuDNN's y = alpha * op + beta * y. Float for
// f32, f16 and bf16 data alike (cuDNN's scaling parameters are float for
// every type but double).
inline constexpr float kCudnnOne = 1.0f;
inline constexpr float kCudnnZero = 0.0f;

// The cuDNN type of a layer's activations: f32, or f16/bf16 for mixed
// precision; anything else throws naming the layer.
inline cudnnDataType_t CudnnDataTypeOf(DType t, const std::string& layer) {
  switch (t) {
    case DType::kF32:
      return CUDNN_DATA_FLOAT;
    case DType::kF16:
      return CUDNN_DATA_HALF;
    case DType::kBF16:
      return CUDNN_DATA_BFLOAT16;
    default:
      throw Error(StrCat(layer,
                         ": the cuDNN layers take f32 tensors (f16/bf16 for mixed precision), got ",
                         DTypeName(t)));
  }
}

// v as cuDNN's int dimension; throws naming the layer and the dimension.
inline int CudnnInt(int64_t v, const std::string& layer, const char* what) {
  CNNFLOW_ENFORCE(v >= 0 && v <= INT_MAX, layer, ": ", what, " ", v,
                  " does not fit cuDNN's int dimensions");
  return static_cast<int>(v);
}

// "<type> 'name'" of a layer, for messages; made on first use and kept
// (Forward runs every step).
class LayerLabel {
 public:
  const std::string& Of(const Layer& layer) const {
    if (text_.empty()) text_ = StrCat(layer.type(), " '", layer.name(), "'");
    return text_;
  }

 private:
  mutable std::string text_;
};

// Whether a convolution on `data` may take an algorithm that converts its
// data down (CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, to f16): only f16 data,
// which loses nothing; f32 would lose precision, bf16 range.
inline bool CudnnMayDownConvert(cudnnDataType_t data) { return data == CUDNN_DATA_HALF; }

// Which of cuDNN's search results a convolution may take.
struct CudnnPickRules {
  // CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION (CudnnMayDownConvert: f16 data).
  bool allow_down_conversion = false;
  // Tensor-op math (CUDNN_TENSOR_OP_MATH and the converting one); false for
  // f32 data without TF32 (graph.tf32: false), which then runs FMA math.
  bool allow_tensor_ops = true;
  // Only CUDNN_DETERMINISTIC algorithms (graph.deterministic).
  bool deterministic_only = false;
};

// The index of the algorithm to use among cuDNN's search results (sorted
// fastest first): the first that succeeded, fits in `workspace_limit`
// bytes and keeps `rules`. -1 when none qualifies. Plain ints so a test can
// call it with made-up results. (conv_cudnn.cc)
int PickCudnnAlgo(const int* status, const int* math_type, const int* determinism,
                  const size_t* memory, int count, size_t workspace_limit,
                  const CudnnPickRules& rules);

// The 4D NCHW dims cuDNN sees for a batchnorm input [N, C], [N, C, L] or
// [N, C, H, W]: [N, C, 1, 1], [N, C, 1, L], [N, C, H, W]. Empty for any
// other rank. (batch_norm_cudnn.cc)
std::vector<int64_t> BatchNormCudnnDims(const std::vector<int64_t>& shape);

}  // namespace cnnflow::detail
