#include "onnx/node_attrs.h"

#include <charconv>
#include <cstdlib>

namespace cnnflow::onnx_io {

double Decimal(float f) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, f);
  return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

}  // namespace cnnflow::onnx_io
