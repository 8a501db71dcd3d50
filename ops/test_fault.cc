#include "ops/test_fault.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ops/collectives/collective_mpi.h"
#include "ops/error.h"

namespace cnnflow {
namespace {

enum class FaultMode { kNone, kExit0, kExit1, kAbort, kStop, kRun };

struct Fault {
  FaultMode mode = FaultMode::kNone;
  int rank = 0;
  int64_t step = 0;
  std::string text;     // the mode's name, for the line printed before dying
  std::string command;  // mode=run's
};

// A test hook's value, "key=value,key=value": its parts, and the Error
// for a malformed one (naming the variable, the value and the form).
struct HookValue {
  const char* name;  // the variable
  const char* form;  // the form it expects
  std::string value;

  Error Bad(const std::string& why) const {
    return Error(StrCat(name, "=\"", value, "\": ", why, " (expected ", form, ")"));
  }
  std::vector<std::pair<std::string, std::string>> Pairs() const {
    std::vector<std::pair<std::string, std::string>> pairs;
    std::stringstream in(value);
    std::string item;
    while (std::getline(in, item, ',')) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos) throw Bad(StrCat("'", item, "' is not key=value"));
      pairs.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    }
    return pairs;
  }
  int64_t Count(const std::string& key, const std::string& v) const {
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < 0) throw Bad(StrCat(key, " '", v, "' is not a count"));
    return n;
  }
};

// Parses "rank=1,step=5,mode=exit1" or "rank=3,step=25,mode=run,cmd=A, B";
// throws Error naming the bad part. cmd= comes last and takes the rest of
// the value, commas and all.
Fault ParseFault(const std::string& value) {
  Fault f;
  std::string keys = value;
  size_t cmd = value.rfind("cmd=", 0) == 0 ? 0 : value.find(",cmd=");
  if (cmd != std::string::npos) {
    if (cmd > 0) ++cmd;  // past the comma
    f.command = value.substr(cmd + 4);
    keys = value.substr(0, cmd > 0 ? cmd - 1 : 0);
  }
  const HookValue h{"CNNFLOW_TEST_FAULT",
                    "rank=R,step=S|start,mode=exit0|exit1|abort|stop, or mode=run,cmd=COMMAND",
                    value};
  bool has_step = false;
  for (const auto& [key, v] : HookValue{h.name, h.form, keys}.Pairs()) {
    if (key == "step" && v == "start") {
      f.step = kTestFaultAtStart, has_step = true;
    } else if (key == "rank") {
      f.rank = static_cast<int>(h.Count(key, v));
    } else if (key == "step") {
      f.step = h.Count(key, v), has_step = true;
    } else if (key == "mode") {
      f.text = v;
      f.mode = v == "exit0"   ? FaultMode::kExit0
               : v == "exit1" ? FaultMode::kExit1
               : v == "abort" ? FaultMode::kAbort
               : v == "stop"  ? FaultMode::kStop
               : v == "run"   ? FaultMode::kRun
                              : FaultMode::kNone;
      if (f.mode == FaultMode::kNone) throw h.Bad(StrCat("unknown mode '", v, "'"));
    } else {
      throw h.Bad(StrCat("unknown key '", key, "'"));
    }
  }
  if (f.mode == FaultMode::kNone || !has_step) throw h.Bad("needs step= and mode=");
  if ((f.mode == FaultMode::kRun) != !f.command.empty()) {
    throw h.Bad("mode=run, and only it, needs cmd=COMMAND (the last key)");
  }
  return f;
}

struct SlowRank {
  int rank = -1;  // none
  int64_t ms = 0;
};

// Parses "rank=1,ms=40"; throws Error naming the bad part.
SlowRank ParseSlowRank(const std::string& value) {
  const HookValue h{"CNNFLOW_TEST_SLOW_RANK", "rank=R,ms=M", value};
  SlowRank s;
  bool has_rank = false, has_ms = false;
  for (const auto& [key, v] : h.Pairs()) {
    if (key == "rank") {
      s.rank = static_cast<int>(h.Count(key, v)), has_rank = true;
    } else if (key == "ms") {
      s.ms = h.Count(key, v), has_ms = true;
    } else {
      throw h.Bad(StrCat("unknown key '", key, "'"));
    }
  }
  if (!has_rank || !has_ms) throw h.Bad("needs rank= and ms=");
  return s;
}

struct SlowStart {
  int rank = -1;  // none
  int64_t seconds = 0;
  int64_t step = kTestFaultAtStart;
};

// Parses "rank=1,s=6" or "rank=1,s=6,step=0"; throws Error naming the bad part.
SlowStart ParseSlowStart(const std::string& value) {
  const HookValue h{"CNNFLOW_TEST_SLOW_START", "rank=R,s=S[,step=start|N]", value};
  SlowStart s;
  bool has_rank = false, has_s = false;
  for (const auto& [key, v] : h.Pairs()) {
    if (key == "rank") {
      s.rank = static_cast<int>(h.Count(key, v)), has_rank = true;
    } else if (key == "s") {
      s.seconds = h.Count(key, v), has_s = true;
    } else if (key == "step") {
      s.step = v == "start" ? kTestFaultAtStart : h.Count(key, v);
    } else {
      throw h.Bad(StrCat("unknown key '", key, "'"));
    }
  }
  if (!has_rank || !has_s) throw h.Bad("needs rank= and s=");
  return s;
}

// Hook `name`'s setting (T() when unset), read once: a static's
// initialiser runs on the first call only.
template <typename T, T (*Parse)(const std::string&)>
const T& ReadHook(const char* name) {
  static const T setting = [name] {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? Parse(v) : T();
  }();
  return setting;
}

}  // namespace

void MaybeSlowTestRank(int global_replica) {
  const SlowRank& s = ReadHook<SlowRank, ParseSlowRank>("CNNFLOW_TEST_SLOW_RANK");
  if (s.rank == global_replica) std::this_thread::sleep_for(std::chrono::milliseconds(s.ms));
}

void MaybeSlowTestStart(int64_t global_step) {
  const SlowStart& s = ReadHook<SlowStart, ParseSlowStart>("CNNFLOW_TEST_SLOW_START");
  if (s.rank < 0 || s.step != global_step || MpiWorld::Get().rank() != s.rank) return;
  std::fprintf(
      stderr, "cnnflow: CNNFLOW_TEST_SLOW_START: rank %d sleeps %lld s at %s\n", s.rank,
      static_cast<long long>(s.seconds),
      global_step == kTestFaultAtStart ? "start-up" : StrCat("step ", global_step).c_str());
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::seconds(s.seconds));
}

void MaybeInjectTestFault(int64_t global_step) {
  const Fault& f = ReadHook<Fault, ParseFault>("CNNFLOW_TEST_FAULT");
  if (f.mode == FaultMode::kNone || f.step != global_step || MpiWorld::Get().rank() != f.rank) {
    return;
  }
  const std::string what = f.mode == FaultMode::kRun ? StrCat("runs `", f.command, "`") : f.text;
  if (global_step == kTestFaultAtStart) {
    std::fprintf(stderr, "cnnflow: CNNFLOW_TEST_FAULT: rank %d %s at start-up\n", f.rank,
                 what.c_str());
  } else {
    std::fprintf(stderr, "cnnflow: CNNFLOW_TEST_FAULT: rank %d %s at step %lld\n", f.rank,
                 what.c_str(), static_cast<long long>(global_step));
  }
  std::fflush(nullptr);
  switch (f.mode) {
    case FaultMode::kExit0:
      std::_Exit(0);
    case FaultMode::kExit1:
      std::_Exit(1);
    case FaultMode::kAbort:
      std::abort();
    case FaultMode::kStop:
      std::raise(SIGSTOP);  // until a SIGCONT; then it goes on
      break;
    case FaultMode::kRun:  // /bin/sh -c, its $PPID this process; then it goes on, if alive
      if (std::system(f.command.c_str()) != 0) {
        std::fprintf(stderr, "cnnflow: CNNFLOW_TEST_FAULT: the command failed\n");
      }
      break;
    case FaultMode::kNone:
      break;
  }
}

}  // namespace cnnflow
