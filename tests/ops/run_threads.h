// Runs fn(rank) on n threads at once and collects each one's exception: how
// tests play the replicas of a collective, each calling from its own thread.
#pragma once

#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace cnnflow::testing {

// Each rank's exception (null if none), after every thread has joined.
inline std::vector<std::exception_ptr> RunRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace cnnflow::testing
