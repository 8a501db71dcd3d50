#include "onnx/tensor_proto.h"

#include <algorithm>
#include <cstring>

#include "ops/error.h"

namespace cnnflow::onnx_io {
namespace {

// The ONNX TensorProto data types the importer reads.
enum OnnxType : int {
  kFloat = 1,
  kInt32 = 6,
  kInt64 = 7,
  kFloat16 = 10,
  kDouble = 11,
  kBFloat16 = 16
};

}  // namespace

Tensor ReadTensor(const onnx::TensorProto& t, const std::string& where) {
  if (t.data_location() == onnx::TensorProto_DataLocation_EXTERNAL) {
    throw Error(StrCat(where, ": tensor '", t.name(),
                       "' is stored in an external file; save the model with its weights "
                       "inside (onnx.save_model(m, path, save_as_external_data=False))"));
  }
  if (t.dims_size() > 8)
    throw Error(StrCat(where, ": tensor '", t.name(), "' has ", t.dims_size(), " dimensions"));
  std::vector<int64_t> dims;
  int64_t n = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || d > (int64_t{1} << 32))
      throw Error(StrCat(where, ": tensor '", t.name(), "' has dimension ", d));
    n *= d;
    if (n > (int64_t{1} << 34))
      throw Error(StrCat(where, ": tensor '", t.name(), "' is too large"));
    dims.push_back(d);
  }
  const Shape shape = dims.empty() ? Shape{1} : Shape(dims);
  const size_t raw = t.raw_data().size();
  const bool has_raw = t.has_raw_data();
  auto bad_size = [&](int64_t have, const char* unit) {
    return Error(StrCat(where, ": tensor '", t.name(), "' ", shape, " holds ", have, " ", unit,
                        ", expected ", n));
  };
  auto from_raw = [&](DType dtype) {
    const size_t es = DTypeSize(dtype);
    if (raw != static_cast<size_t>(n) * es)
      throw bad_size(static_cast<int64_t>(raw / es), "values");
    Tensor out = Tensor::Empty(shape, dtype);
    if (n > 0) std::memcpy(out.raw_data(), t.raw_data().data(), raw);  // little-endian, as ONNX
    return out;
  };
  switch (t.data_type()) {
    case kFloat: {
      if (has_raw) return from_raw(DType::kF32);
      if (t.float_data_size() != n) throw bad_size(t.float_data_size(), "floats");
      Tensor out = Tensor::Empty(shape, DType::kF32);
      std::copy(t.float_data().begin(), t.float_data().end(), out.data<float>());
      return out;
    }
    case kDouble: {
      if (has_raw) return from_raw(DType::kF64).Cast(DType::kF32);
      if (t.double_data_size() != n) throw bad_size(t.double_data_size(), "doubles");
      Tensor out = Tensor::Empty(shape, DType::kF32);
      std::copy(t.double_data().begin(), t.double_data().end(), out.data<float>());
      return out;
    }
    case kFloat16:
    case kBFloat16: {
      const DType half = t.data_type() == kFloat16 ? DType::kF16 : DType::kBF16;
      if (has_raw) return from_raw(half).Cast(DType::kF32);
      if (t.int32_data_size() != n) throw bad_size(t.int32_data_size(), "values");
      Tensor h = Tensor::Empty(shape, half);
      auto* bits = static_cast<uint16_t*>(h.raw_data());
      for (int64_t i = 0; i < n; ++i)
        bits[i] = static_cast<uint16_t>(t.int32_data(static_cast<int>(i)));
      return h.Cast(DType::kF32);
    }
    case kInt64: {
      if (has_raw) return from_raw(DType::kI64);
      if (t.int64_data_size() != n) throw bad_size(t.int64_data_size(), "integers");
      Tensor out = Tensor::Empty(shape, DType::kI64);
      std::copy(t.int64_data().begin(), t.int64_data().end(), out.data<int64_t>());
      return out;
    }
    case kInt32: {
      Tensor out = Tensor::Empty(shape, DType::kI64);
      if (has_raw) {
        if (raw != static_cast<size_t>(n) * 4)
          throw bad_size(static_cast<int64_t>(raw / 4), "integers");
        for (int64_t i = 0; i < n; ++i) {
          int32_t v;
          std::memcpy(&v, t.raw_data().data() + 4 * i, 4);
          out.data<int64_t>()[i] = v;
        }
      } else {
        if (t.int32_data_size() != n) throw bad_size(t.int32_data_size(), "integers");
        std::copy(t.int32_data().begin(), t.int32_data().end(), out.data<int64_t>());
      }
      return out;
    }
    default:
      throw Error(StrCat(where, ": tensor '", t.name(), "' has ONNX data type ", t.data_type(),
                         " (the importer reads float, double, float16, bfloat16, int32, int64)"));
  }
}

std::vector<int64_t> IntsOf(const Tensor& t) {
  std::vector<int64_t> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = static_cast<int64_t>(t.At(i));
  return v;
}

}  // namespace cnnflow::onnx_io
