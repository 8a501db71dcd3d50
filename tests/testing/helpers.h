// Helpers shared by the tests: a LayerSpec in one line, a comparison of a
// tensor with reference values that reports the first few differences, and
// the text of an error.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "ops/model.h"
#include "ops/random.h"

namespace cnnflow::testing {

// An h x w image of c uint8 channels (HWC, as decoded) of uniform values.
inline std::vector<uint8_t> RandomImage(int h, int w, int c, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint8_t> p(static_cast<size_t>(h) * w * c);
  for (auto& v : p) v = static_cast<uint8_t>(rng.Below(256));
  return p;
}

// {name, type, {param: value, ...}, inputs} as a LayerSpec.
inline LayerSpec Spec(std::string name, std::string type,
                      std::vector<std::pair<std::string, ParamValue>> args = {},
                      std::vector<std::string> inputs = {}) {
  LayerSpec s;
  s.name = std::move(name);
  s.type = std::move(type);
  s.inputs = std::move(inputs);
  for (auto& [k, v] : args) s.args.Set(k, v);
  return s;
}

// got[i] == want[i] within tol * (1 + |want[i]|) for every i (equal
// infinities and NaN with NaN count as equal); the first 5 that differ are
// reported, named `what`.
inline void ExpectNear(const std::vector<double>& want, const Tensor& got, double tol,
                       const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(want.size()), got.numel()) << what;
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got.At(static_cast<int64_t>(i));
    const bool same = g == want[i] || (std::isnan(g) && std::isnan(want[i])) ||
                      std::abs(g - want[i]) <= tol * (1 + std::abs(want[i]));
    if (!same && bad++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << g << ", want " << want[i];
    }
  }
}

// The message of the E that f() throws; "" when it throws none (the test
// then fails on the text it expects). Another exception propagates.
template <typename E = Error, typename F>
std::string ErrorOf(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

// Every piece is in `text` (an error message); a failure names each
// missing piece and shows the text.
// Whether two tensors hold the same bytes, shape and dtype.
inline bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

inline void ExpectContains(const std::string& text, const std::vector<std::string>& pieces) {
  if (text.empty()) ADD_FAILURE() << "no error; expected one with '" << pieces.front() << "'";
  for (const std::string& p : pieces) {
    EXPECT_NE(text.find(p), std::string::npos) << "'" << p << "' not in: " << text;
  }
}

}  // namespace cnnflow::testing
