#include "ops/test_fault.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

#include "ops/collectives/collective_mpi.h"
#include "ops/error.h"

namespace cnnflow {
namespace {

enum class FaultMode { kNone, kExit0, kExit1, kAbort };

struct Fault {
  FaultMode mode = FaultMode::kNone;
  int rank = 0;
  int64_t step = 0;
  std::string text;  // the mode's name, for the line printed before dying
};

// Parses "rank=1,step=5,mode=exit1"; throws Error naming the bad part.
Fault ParseFault(const std::string& value) {
  Fault f;
  bool has_step = false;
  std::stringstream in(value);
  std::string item;
  const auto bad = [&](const std::string& why) {
    return Error(StrCat("CNNFLOW_TEST_FAULT=\"", value, "\": ", why,
                        " (expected rank=R,step=S|start,mode=exit0|exit1|abort)"));
  };
  while (std::getline(in, item, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) throw bad(StrCat("'", item, "' is not key=value"));
    const std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    char* end = nullptr;
    if (key == "step" && v == "start") {
      f.step = kTestFaultAtStart, has_step = true;
    } else if (key == "rank" || key == "step") {
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 0) throw bad(StrCat(key, " '", v, "' is not a count"));
      if (key == "rank") f.rank = static_cast<int>(n);
      if (key == "step") f.step = n, has_step = true;
    } else if (key == "mode") {
      f.text = v;
      f.mode = v == "exit0"   ? FaultMode::kExit0
               : v == "exit1" ? FaultMode::kExit1
               : v == "abort" ? FaultMode::kAbort
                              : FaultMode::kNone;
      if (f.mode == FaultMode::kNone) throw bad(StrCat("unknown mode '", v, "'"));
    } else {
      throw bad(StrCat("unknown key '", key, "'"));
    }
  }
  if (f.mode == FaultMode::kNone || !has_step) throw bad("needs step= and mode=");
  return f;
}

// Read once: a static's initialiser runs on the first call only.
const Fault& TheFault() {
  static const Fault fault = [] {
    const char* v = std::getenv("CNNFLOW_TEST_FAULT");
    return v != nullptr && *v != '\0' ? ParseFault(v) : Fault();
  }();
  return fault;
}

}  // namespace

void MaybeInjectTestFault(int64_t global_step) {
  const Fault& f = TheFault();
  if (f.mode == FaultMode::kNone || f.step != global_step || MpiWorld::Get().rank() != f.rank) {
    return;
  }
  if (global_step == kTestFaultAtStart) {
    std::fprintf(stderr, "cnnflow: CNNFLOW_TEST_FAULT: rank %d %s at start-up\n", f.rank,
                 f.text.c_str());
  } else {
    std::fprintf(stderr, "cnnflow: CNNFLOW_TEST_FAULT: rank %d %s at step %lld\n", f.rank,
                 f.text.c_str(), static_cast<long long>(global_step));
  }
  std::fflush(nullptr);
  switch (f.mode) {
    case FaultMode::kExit0:
      std::_Exit(0);
    case FaultMode::kExit1:
      std::_Exit(1);
    case FaultMode::kAbort:
      std::abort();
    case FaultMode::kNone:
      break;
  }
}

}  // namespace cnnflow
