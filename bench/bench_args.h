// Command-line helpers shared by the benchmarks.
#pragma once

#include <cstdlib>
#include <vector>

namespace cnnflow::bench {

// "1,4,25" -> {1, 4, 25}; stops at the first item that is not a number.
inline std::vector<double> ParseList(const char* s) {
  std::vector<double> out;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    out.push_back(std::strtod(p, &end));
    if (end == p) break;
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

}  // namespace cnnflow::bench
