// Tensor: a shape, strides, an element type and a device over pooled,
// 64-byte-aligned storage. Views (reshape, batch slices) share storage.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ops/device.h"
#include "ops/dtype.h"
#include "ops/error.h"
#include "ops/shape.h"

namespace cnnflow {

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised memory from the device's pool.
  static Tensor Empty(const Shape& shape, DType dtype = DType::kF32, Device device = Device::Cpu());
  static Tensor Zeros(const Shape& shape, DType dtype = DType::kF32, Device device = Device::Cpu());
  // A contiguous tensor of `shape` over the start of `storage` (which must
  // hold it), sharing it.
  static Tensor FromStorage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype);
  // A host f32/f64 tensor with every element set to `value`.
  static Tensor Full(const Shape& shape, double value, DType dtype = DType::kF32);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  bool is_contiguous() const;

  void* raw_data() const;
  // Typed pointer to the first element; checks the dtype.
  template <typename T>
  T* data() const {
    CNNFLOW_ENFORCE(dtype_ == DTypeOf<T>(), "tensor holds ", DTypeName(dtype_), ", accessed as ",
                    DTypeName(DTypeOf<T>()));
    return static_cast<T*>(raw_data());
  }

  // A view with another shape of the same element count (contiguous only).
  Tensor Reshape(const Shape& shape) const;
  // A view of rows [begin, end) of the first dimension (shares storage).
  Tensor Slice(int64_t begin, int64_t end) const;
  // A contiguous copy on `device`.
  Tensor To(Device device) const;
  Tensor Clone() const { return To(device_); }
  // A copy converted to another element type (host only, f32 <-> f64).
  Tensor Cast(DType dtype) const;
  // Copies src's elements (same shape and dtype; any devices) into this.
  void CopyFrom(const Tensor& src);
  void Zero();
  // Host element i as a double (slow; for tests and small reports).
  double At(int64_t i) const;
  void Set(int64_t i, double v);

 private:
  Shape shape_;
  std::vector<int64_t> strides_;
  DType dtype_ = DType::kF32;
  Device device_;
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
};

// labels[0..n) (host memory) as an [n] i64 tensor on `device`.
Tensor LabelTensor(const int64_t* labels, int64_t n, Device device);

// Calls fn with a typed null pointer for the tensor's dtype (f32 or f64),
// so a kernel templated on T can be dispatched: DispatchFloat(t, [&](auto* tag){ using T = ...; }).
template <typename Fn>
void DispatchFloat(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      fn(static_cast<float*>(nullptr));
      return;
    case DType::kF64:
      fn(static_cast<double*>(nullptr));
      return;
    default:
      throw Error(StrCat("no CPU kernel for dtype ", DTypeName(dtype)));
  }
}

}  // namespace cnnflow
