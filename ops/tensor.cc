#include "ops/tensor.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <sstream>

namespace cnnflow {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI64:
      return 8;
  }
  return 0;
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI64:
      return "i64";
  }
  return "?";
}

const char* SafetensorsName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF64:
      return "F64";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI64:
      return "I64";
  }
  return "?";
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

Shape Shape::WithBatch(int64_t n) const {
  std::vector<int64_t> d{n};
  d.insert(d.end(), dims_.begin(), dims_.end());
  return Shape(std::move(d));
}

Shape Shape::WithoutBatch() const {
  return Shape(std::vector<int64_t>(dims_.begin() + (dims_.empty() ? 0 : 1), dims_.end()));
}

std::string Shape::ToString() const {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < dims_.size(); ++i) os << (i ? ", " : "") << dims_[i];
  os << ']';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.ToString(); }

namespace {
std::vector<int64_t> ContiguousStrides(const Shape& s) {
  std::vector<int64_t> st(s.rank());
  int64_t acc = 1;
  for (int i = s.rank() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}
}  // namespace

Tensor Tensor::Empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape.dims()) {
    CNNFLOW_ENFORCE(d >= 0, "negative extent in shape ", shape);
  }
  Tensor t;
  t.shape_ = shape;
  t.strides_ = ContiguousStrides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(device, t.nbytes());
  return t;
}

Tensor Tensor::FromStorage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype) {
  CNNFLOW_ENFORCE(storage != nullptr, "FromStorage without storage");
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = storage->device();
  t.strides_ = ContiguousStrides(shape);
  CNNFLOW_ENFORCE(t.nbytes() <= storage->bytes(), "a tensor of ", shape, " (", t.nbytes(),
                  " bytes) does not fit a storage of ", storage->bytes(), " bytes");
  t.storage_ = std::move(storage);
  return t;
}

Tensor Tensor::Zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = Empty(shape, dtype, device);
  t.Zero();
  return t;
}

Tensor Tensor::Full(const Shape& shape, double value, DType dtype) {
  Tensor t = Empty(shape, dtype);
  DispatchFloat(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(value);
  });
  return t;
}

bool Tensor::is_contiguous() const { return strides_ == ContiguousStrides(shape_); }

void* Tensor::raw_data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * DTypeSize(dtype_);
}

Tensor Tensor::Reshape(const Shape& shape) const {
  CNNFLOW_ENFORCE(is_contiguous(), "reshape of a non-contiguous tensor ", shape_);
  CNNFLOW_ENFORCE(shape.numel() == numel(), "cannot reshape ", shape_, " to ", shape);
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = ContiguousStrides(shape);
  return t;
}

Tensor Tensor::Slice(int64_t begin, int64_t end) const {
  CNNFLOW_ENFORCE(rank() >= 1 && 0 <= begin && begin <= end && end <= dim(0), "slice [", begin,
                  ", ", end, ") out of range for ", shape_);
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.offset_ += begin * strides_[0];
  return t;
}

Tensor Tensor::To(Device device) const {
  CNNFLOW_ENFORCE(is_contiguous(), "copy of a non-contiguous tensor ", shape_);
  Tensor t = Empty(shape_, dtype_, device);
  t.CopyFrom(*this);
  return t;
}

Tensor Tensor::Cast(DType dtype) const {
  CNNFLOW_ENFORCE(device_.is_cpu() && is_contiguous(), "Cast needs a contiguous host tensor");
  Tensor t = Empty(shape_, dtype);
  for (int64_t i = 0; i < numel(); ++i) t.Set(i, At(i));
  return t;
}

void Tensor::CopyFrom(const Tensor& src) {
  CNNFLOW_ENFORCE(src.shape_ == shape_ && src.dtype_ == dtype_, "copy from ", src.shape_, " ",
                  DTypeName(src.dtype_), " into ", shape_, " ", DTypeName(dtype_));
  CNNFLOW_ENFORCE(is_contiguous() && src.is_contiguous(), "copy needs contiguous tensors");
  if (nbytes() == 0) return;
  CopyBytes(device_, raw_data(), src.device_, src.raw_data(), nbytes());
}

Tensor LabelTensor(const int64_t* labels, int64_t n, Device device) {
  Tensor t = Tensor::Empty(Shape({n}), DType::kI64, device);
  if (n > 0) CopyBytes(device, t.raw_data(), Device::Cpu(), labels, static_cast<size_t>(n) * 8);
  return t;
}

void Tensor::Zero() {
  CNNFLOW_ENFORCE(is_contiguous(), "Zero needs a contiguous tensor");
  if (nbytes() > 0) ZeroBytes(device_, raw_data(), nbytes());
}

namespace {
// The value of IEEE binary16 bits (exact: every half is a double).
double HalfBitsValue(uint16_t h) {
  const int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  const double v = exp == 0    ? std::ldexp(man, -24)  // zero, subnormal
                   : exp == 31 ? (man ? std::numeric_limits<double>::quiet_NaN()
                                      : std::numeric_limits<double>::infinity())
                               : std::ldexp(1024 + man, exp - 25);
  return (h & 0x8000) ? -v : v;
}
}  // namespace

double Tensor::At(int64_t i) const {
  CNNFLOW_ENFORCE(device_.is_cpu() && is_contiguous() && i >= 0 && i < numel(), "At(", i, ") on ",
                  shape_);
  if (dtype_ == DType::kI64) return static_cast<double>(data<int64_t>()[i]);
  // Half types are read (weights saved in f16 or bf16 load into an f32
  // model through Cast), never computed in on the host.
  if (dtype_ == DType::kF16) return HalfBitsValue(static_cast<const uint16_t*>(raw_data())[i]);
  if (dtype_ == DType::kBF16) {
    const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(raw_data())[i]) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  double v = 0;
  DispatchFloat(dtype_, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    v = static_cast<double>(data<T>()[i]);
  });
  return v;
}

void Tensor::Set(int64_t i, double v) {
  CNNFLOW_ENFORCE(device_.is_cpu() && is_contiguous() && i >= 0 && i < numel(), "Set(", i, ") on ",
                  shape_);
  if (dtype_ == DType::kI64) {
    data<int64_t>()[i] = static_cast<int64_t>(v);
    return;
  }
  DispatchFloat(dtype_, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    data<T>()[i] = static_cast<T>(v);
  });
}

}  // namespace cnnflow
