// Typed parameter schemas: the one description of a layer's or a stage's
// parameters (name, type, default, doc). The YAML front end (pipeline/)
// checks user input against it, `cnnflow stages` prints it, and the unit
// reads its values back from Args. ops/ itself knows nothing of YAML.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace cnnflow {

enum class ParamType {
  kInt,
  kFloat,
  kBool,
  kString,
  kIntList,    // accepts a scalar too: `kernel: 3` == `kernel: [3, 3]`
  kFloatList,  // accepts a scalar too
  kStringList,
  kTree,  // any YAML subtree, kept as text; the unit parses it itself
};
const char* ParamTypeName(ParamType t);

using ParamValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>,
                                std::vector<double>, std::vector<std::string>>;

struct ParamSpec {
  std::string name;
  ParamType type = ParamType::kInt;
  std::optional<ParamValue> default_value;  // none: required
  std::string doc;
  std::vector<std::string> choices;  // for kString: the allowed values (empty: any)
};

// The schema of one unit (layer type or stage type).
class Schema {
 public:
  Schema() = default;
  explicit Schema(std::string doc) : doc_(std::move(doc)) {}

  Schema& Required(std::string name, ParamType type, std::string doc);
  Schema& Optional(std::string name, ParamType type, ParamValue default_value, std::string doc);
  Schema& Choice(std::string name, std::vector<std::string> choices, std::string default_value,
                 std::string doc);

  const std::string& doc() const { return doc_; }
  const std::vector<ParamSpec>& params() const { return params_; }
  const ParamSpec* Find(const std::string& name) const;
  std::vector<std::string> Names() const;

 private:
  std::string doc_;
  std::vector<ParamSpec> params_;
};

// Parameter values checked against a schema (defaults filled in).
class Args {
 public:
  void Set(const std::string& name, ParamValue v) { values_[name] = std::move(v); }
  bool Has(const std::string& name) const { return values_.count(name) != 0; }

  int64_t Int(const std::string& name) const;
  double Float(const std::string& name) const;  // an int converts
  bool Bool(const std::string& name) const;
  const std::string& String(const std::string& name) const;
  // A list of exactly n ints (a scalar given by the user is repeated).
  std::vector<int64_t> Ints(const std::string& name, size_t n) const;
  std::vector<int64_t> Ints(const std::string& name) const;
  std::vector<double> Floats(const std::string& name) const;
  std::vector<std::string> Strings(const std::string& name) const;
  const std::map<std::string, ParamValue>& values() const { return values_; }

  // Defaults of every optional parameter not yet set.
  void FillDefaults(const Schema& schema);

 private:
  const ParamValue& Get(const std::string& name) const;
  std::map<std::string, ParamValue> values_;
};

std::string ParamValueToString(const ParamValue& v);

// Edit distance, for "did you mean" suggestions.
size_t EditDistance(const std::string& a, const std::string& b);
// The closest of `known` to `word`, or "" when none is close enough.
std::string ClosestMatch(const std::string& word, const std::vector<std::string>& known);
// "a, b, c"
std::string JoinNames(const std::vector<std::string>& names);
// "unknown X 'y' (did you mean 'z'?); known: a, b, c"
std::string UnknownNameMessage(const std::string& what, const std::string& name,
                               const std::vector<std::string>& known);

}  // namespace cnnflow
