// Errors with context. Library code throws; it never aborts the process, so
// the executor can cancel the graph, write what it can, and report.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace cnnflow {

// Base of every error cnnflow throws on purpose.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A tensor shape does not fit a layer; found when the model is built.
class ShapeError : public Error {
 public:
  using Error::Error;
};

// A configuration (YAML or --set) is wrong; the message names where.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// Concatenates any streamable arguments into one string.
template <typename... Args>
std::string StrCat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

}  // namespace cnnflow

// CNNFLOW_ENFORCE(cond, msg...) throws cnnflow::Error with the message and
// the source location when cond is false.
#define CNNFLOW_ENFORCE(cond, ...)                                                            \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      throw ::cnnflow::Error(                                                                 \
          ::cnnflow::StrCat(__VA_ARGS__, " [", #cond, " at ", __FILE__, ":", __LINE__, "]")); \
    }                                                                                         \
  } while (0)
