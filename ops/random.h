// Random numbers that do not depend on thread count or call order: a value
// is a pure function of (key, counter), so a dropout mask or an augmentation
// is the same whichever thread draws it.
#pragma once

#include <cmath>
#include <cstdint>

namespace cnnflow {

// SplitMix64's finaliser: a good 64-bit mix.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A key for a stream of random numbers, from any number of integers.
inline uint64_t StreamKey(uint64_t a, uint64_t b = 0, uint64_t c = 0, uint64_t d = 0) {
  return Mix64(Mix64(Mix64(Mix64(a) ^ b) ^ c) ^ d);
}

// Uniform in [0, 1) for element `counter` of stream `key`.
inline double UniformAt(uint64_t key, uint64_t counter) {
  return static_cast<double>(Mix64(key ^ Mix64(counter)) >> 11) * 0x1.0p-53;
}

// A sequential generator (parameter init, shuffles): counter-based too, so
// its state is two integers and can be saved in a checkpoint.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0, uint64_t stream = 0) : key_(StreamKey(seed, stream)) {}
  uint64_t NextU64() { return Mix64(key_ ^ Mix64(counter_++)); }
  double Uniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Box-Muller; one normal per call (simple and reproducible).
  double Normal(double mean = 0, double stddev = 1) {
    double u1 = Uniform(), u2 = Uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return mean + stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // Uniform integer in [0, n).
  uint64_t Below(uint64_t n) { return static_cast<uint64_t>(Uniform() * static_cast<double>(n)); }
  uint64_t key() const { return key_; }
  uint64_t counter() const { return counter_; }
  void Restore(uint64_t key, uint64_t counter) { key_ = key, counter_ = counter; }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace cnnflow
