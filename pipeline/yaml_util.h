// YAML with locations: every config error names the file, line, column and
// key, says what was expected, and suggests the closest known name. Values
// that came from `--set key=value` are reported as such.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "ops/error.h"
#include "ops/schema.h"

namespace cnnflow {

// A parsed YAML file and the --set overrides applied to it.
class YamlDoc {
 public:
  // Parses `path`; a syntax error becomes a ConfigError with file:line:col.
  static YamlDoc Load(const std::string& path);
  static YamlDoc Parse(const std::string& text, const std::string& name);

  const std::string& path() const { return path_; }
  YAML::Node& root() { return root_; }
  const YAML::Node& root() const { return root_; }

  // Applies "a.b.c=value" (value parsed as YAML) to the tree.
  void Override(const std::string& assignment);

  // "file:line:col" of a node (or "--set a.b=v" for an override).
  std::string Where(const YAML::Node& node) const;
  // Throws ConfigError "<where>: <context>: <message>".
  [[noreturn]] void Fail(const YAML::Node& node, const std::string& context,
                         const std::string& message) const;

  // Checks a mapping against a schema: unknown keys (with a suggestion and
  // the known keys), wrong types, missing required keys. Returns the values
  // with defaults filled in. `context` names the unit ("layer 'conv1' (conv2d)").
  Args CheckArgs(const YAML::Node& map, const Schema& schema, const std::string& context) const;
  // A scalar used as a name (a key, a layer or stage name, a source type);
  // a list, a mapping or nothing there fails with its location (yaml-cpp's
  // as<std::string>() would throw its own exception, which names no file).
  std::string Name(const YAML::Node& node, const std::string& context) const;

  // One value of a given type (for CheckArgs and for callers).
  ParamValue Value(const YAML::Node& node, const ParamSpec& spec, const std::string& context) const;

 private:
  std::string path_;
  YAML::Node root_;
  struct OverrideNode {
    YAML::Node node;
    std::string text;
  };
  std::vector<OverrideNode> overrides_;
};

// Sets `key` ("section.name") to the YAML scalar `value` in a config's
// text, keeping everything else (comments, order, layout) as it was: an
// existing plain scalar is replaced where it stands, a missing key is added
// to its section (flow `{...}` or block), a missing section is appended.
// Throws ConfigError if the key's current value is not a scalar.
std::string SetYamlScalar(const std::string& text, const std::string& key, const std::string& value,
                          const std::string& name);

}  // namespace cnnflow
