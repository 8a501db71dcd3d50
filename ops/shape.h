// Tensor shapes: a small vector of extents, printed as [N, C, H, W].
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace cnnflow {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int i) const { return dims_[i < 0 ? i + rank() : i]; }
  int64_t& operator[](int i) { return dims_[i < 0 ? i + rank() : i]; }
  int64_t numel() const;
  const std::vector<int64_t>& dims() const { return dims_; }

  // The shape with `n` prepended (a sample shape -> a batch shape).
  Shape WithBatch(int64_t n) const;
  // The shape without its first dimension (a batch shape -> a sample shape).
  Shape WithoutBatch() const;

  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }
  std::string ToString() const;

 private:
  std::vector<int64_t> dims_;
};

std::ostream& operator<<(std::ostream& os, const Shape& s);

}  // namespace cnnflow
