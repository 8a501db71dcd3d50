#include "tools/command_line.h"

#include <algorithm>
#include <cstdlib>

namespace cnnflow {

bool CommandLine::Next() {
  if (has_inline_) throw UsageError(StrCat(arg_, " takes no value, got '", inline_value_, "'"));
  if (next_ >= args_.size()) return false;
  arg_ = args_[next_++];
  const size_t eq = arg_.find('=');
  has_inline_ = arg_.rfind("--", 0) == 0 && eq != std::string::npos;
  if (has_inline_) {
    inline_value_ = arg_.substr(eq + 1);
    arg_.resize(eq);
  }
  return true;
}

std::string CommandLine::Value() {
  if (has_inline_) {
    has_inline_ = false;
    return inline_value_;
  }
  if (next_ >= args_.size()) throw UsageError(StrCat(arg_, " needs a value"));
  return args_[next_++];
}

namespace {

// v as a whole number >= min, else UsageError naming `flag`.
int64_t WholeNumber(const std::string& flag, const std::string& v, int64_t min) {
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < min) {
    throw UsageError(StrCat(flag, " needs a whole number >= ", min, ", got '", v, "'"));
  }
  return n;
}

}  // namespace

int64_t CommandLine::Count(int64_t min) { return WholeNumber(arg_, Value(), min); }

std::vector<int64_t> CommandLine::CountList(int64_t min) {
  std::vector<int64_t> out;
  const std::string v = Value();
  for (size_t b = 0; b <= v.size();) {
    const size_t e = std::min(v.find(',', b), v.size());
    out.push_back(WholeNumber(arg_, v.substr(b, e - b), min));
    b = e + 1;
  }
  return out;
}

double CommandLine::Seconds() {
  const std::string v = Value();
  char* end = nullptr;
  const double s = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(s > 0)) {
    throw UsageError(StrCat(arg_, " needs seconds > 0, got '", v, "'"));
  }
  return s;
}

void CommandLine::Reject() const {
  throw UsageError(IsOption() ? StrCat("unknown option '", arg_, "'")
                              : StrCat("unexpected argument '", arg_, "'"));
}

}  // namespace cnnflow
