// Data and the reference sum for the collective tests (in-process and MPI).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace cnnflow::testing {

// n floats uniform in [-1, 1).
inline std::vector<float> RandomData(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// in[lo] + ... + in[hi - 1] in tree order, written out independently of the
// collectives: the left operand sums the largest power of two of them below
// hi - lo, so ((in0 + in1) + (in2 + in3)) + in4.
inline std::vector<float> TreeOrderSum(const std::vector<std::vector<float>>& in, size_t lo,
                                       size_t hi) {
  if (hi - lo == 1) return in[lo];
  size_t left = 1;
  while (left * 2 < hi - lo) left *= 2;
  std::vector<float> out = TreeOrderSum(in, lo, lo + left);
  const std::vector<float> right = TreeOrderSum(in, lo + left, hi);
  for (size_t i = 0; i < out.size(); ++i) out[i] += right[i];
  return out;
}

}  // namespace cnnflow::testing
