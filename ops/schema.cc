#include "ops/schema.h"

#include <algorithm>
#include <charconv>
#include <sstream>

#include "ops/error.h"

namespace cnnflow {

const char* ParamTypeName(ParamType t) {
  switch (t) {
    case ParamType::kInt:
      return "int";
    case ParamType::kFloat:
      return "float";
    case ParamType::kBool:
      return "bool";
    case ParamType::kString:
      return "string";
    case ParamType::kIntList:
      return "int or list of ints";
    case ParamType::kFloatList:
      return "float or list of floats";
    case ParamType::kStringList:
      return "list of strings";
    case ParamType::kTree:
      return "mapping or list";
  }
  return "?";
}

Schema& Schema::Required(std::string name, ParamType type, std::string doc) {
  params_.push_back({std::move(name), type, std::nullopt, std::move(doc), {}});
  return *this;
}

Schema& Schema::Optional(std::string name, ParamType type, ParamValue default_value,
                         std::string doc) {
  params_.push_back({std::move(name), type, std::move(default_value), std::move(doc), {}});
  return *this;
}

Schema& Schema::Choice(std::string name, std::vector<std::string> choices,
                       std::string default_value, std::string doc) {
  params_.push_back({std::move(name), ParamType::kString, ParamValue(std::move(default_value)),
                     std::move(doc), std::move(choices)});
  return *this;
}

const ParamSpec* Schema::Find(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

std::vector<std::string> Schema::Names() const {
  std::vector<std::string> n;
  for (const auto& p : params_) n.push_back(p.name);
  return n;
}

const ParamValue& Args::Get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw Error(StrCat("parameter '", name, "' is not set"));
  return it->second;
}

int64_t Args::Int(const std::string& name) const {
  const ParamValue& v = Get(name);
  if (auto* i = std::get_if<int64_t>(&v)) return *i;
  if (auto* l = std::get_if<std::vector<int64_t>>(&v); l && l->size() == 1) return (*l)[0];
  throw Error(StrCat("parameter '", name, "' is not an int"));
}

double Args::Float(const std::string& name) const {
  const ParamValue& v = Get(name);
  if (auto* d = std::get_if<double>(&v)) return *d;
  if (auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  throw Error(StrCat("parameter '", name, "' is not a float"));
}

bool Args::Bool(const std::string& name) const {
  const ParamValue& v = Get(name);
  if (auto* b = std::get_if<bool>(&v)) return *b;
  throw Error(StrCat("parameter '", name, "' is not a bool"));
}

const std::string& Args::String(const std::string& name) const {
  const ParamValue& v = Get(name);
  if (auto* s = std::get_if<std::string>(&v)) return *s;
  throw Error(StrCat("parameter '", name, "' is not a string"));
}

std::vector<int64_t> Args::Ints(const std::string& name) const {
  const ParamValue& v = Get(name);
  if (auto* i = std::get_if<int64_t>(&v)) return {*i};
  if (auto* l = std::get_if<std::vector<int64_t>>(&v)) return *l;
  throw Error(StrCat("parameter '", name, "' is not a list of ints"));
}

std::vector<int64_t> Args::Ints(const std::string& name, size_t n) const {
  std::vector<int64_t> v = Ints(name);
  if (v.size() == 1 && n > 1) v.assign(n, v[0]);
  if (v.size() != n) {
    throw ConfigError(StrCat("parameter '", name, "' needs ", n, " values, got ", v.size()));
  }
  return v;
}

std::vector<double> Args::Floats(const std::string& name) const {
  const ParamValue& v = Get(name);
  if (auto* d = std::get_if<double>(&v)) return {*d};
  if (auto* i = std::get_if<int64_t>(&v)) return {static_cast<double>(*i)};
  if (auto* l = std::get_if<std::vector<double>>(&v)) return *l;
  if (auto* l = std::get_if<std::vector<int64_t>>(&v)) return {l->begin(), l->end()};
  throw Error(StrCat("parameter '", name, "' is not a list of floats"));
}

std::vector<std::string> Args::Strings(const std::string& name) const {
  const ParamValue& v = Get(name);
  if (auto* s = std::get_if<std::string>(&v)) return {*s};
  if (auto* l = std::get_if<std::vector<std::string>>(&v)) return *l;
  throw Error(StrCat("parameter '", name, "' is not a list of strings"));
}

void Args::FillDefaults(const Schema& schema) {
  for (const auto& p : schema.params())
    if (!Has(p.name) && p.default_value) values_[p.name] = *p.default_value;
}

namespace {

// The shortest decimal that reads back as the same double (0.1, 1e-05,
// 0.7071067811865476), so a value written to YAML loses nothing.
std::string ShortestDecimal(double d) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, d);
  return std::string(buf, r.ptr);
}

}  // namespace

std::string ParamValueToString(const ParamValue& v) {
  std::ostringstream os;
  std::visit(
      [&](const auto& x) {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, bool>) {
          os << (x ? "true" : "false");
        } else if constexpr (std::is_same_v<X, std::string>) {
          os << (x.empty() ? "\"\"" : x);
        } else if constexpr (std::is_floating_point_v<X>) {
          os << ShortestDecimal(x);
        } else if constexpr (std::is_arithmetic_v<X>) {
          os << x;
        } else if constexpr (std::is_same_v<X, std::vector<double>>) {
          os << '[';
          for (size_t i = 0; i < x.size(); ++i) os << (i ? ", " : "") << ShortestDecimal(x[i]);
          os << ']';
        } else {
          os << '[';
          for (size_t i = 0; i < x.size(); ++i) os << (i ? ", " : "") << x[i];
          os << ']';
        }
      },
      v);
  return os.str();
}

size_t EditDistance(const std::string& a, const std::string& b) {
  // Damerau-Levenshtein (optimal string alignment): a swap of two
  // neighbouring letters ("sdg" for "sgd") is one edit, as people type.
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::string list;
  for (const auto& k : names) list += (list.empty() ? "" : ", ") + k;
  return list;
}

std::string UnknownNameMessage(const std::string& what, const std::string& name,
                               const std::vector<std::string>& known) {
  std::string close = ClosestMatch(name, known);
  const std::string list = JoinNames(known);
  return StrCat("unknown ", what, " '", name, "'",
                close.empty() ? "" : StrCat(" (did you mean '", close, "'?)"), "; known: ", list);
}

std::string ClosestMatch(const std::string& word, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = std::string::npos;
  for (const auto& k : known) {
    size_t d = EditDistance(word, k);
    if (d < best_d) {
      best_d = d;
      best = k;
    }
  }
  // Close enough: at most a third of the word's letters wrong (max 3); a
  // word of one or two letters is too short to guess from.
  const size_t limit = word.size() < 3 ? 0 : std::clamp<size_t>(word.size() / 3, 1, 3);
  return best_d <= limit ? best : "";
}

}  // namespace cnnflow
