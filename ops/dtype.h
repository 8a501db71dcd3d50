// Element types. f32 is the training type; f64 exists for gradient checks;
// f16/bf16 are mixed precision on GPU; i64 carries class labels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cnnflow {

enum class DType { kF32, kF64, kF16, kBF16, kI64 };

size_t DTypeSize(DType t);
const char* DTypeName(DType t);        // "f32", ...
const char* SafetensorsName(DType t);  // "F32", ...

template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kF32;
}
template <>
constexpr DType DTypeOf<double>() {
  return DType::kF64;
}
template <>
constexpr DType DTypeOf<int64_t>() {
  return DType::kI64;
}

}  // namespace cnnflow
