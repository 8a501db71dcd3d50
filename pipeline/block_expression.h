// The expression language of model blocks (pipeline/model_blocks.h): a
// scalar with `$` in a block's YAML is evaluated over the params in scope.
//   $name, numbers, 'strings', true, false, (..), list[i]
//   + - * / // %   == != < <= > >=   not and or   c ? a : b
//   int round ceil floor min max make_divisible(v, d)
// '+' joins strings (a number as its text); '/' gives a float, '//' floors.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace cnnflow::blocks {

// A value inside an expression.
struct Value {
  enum Kind { kInt, kFloat, kBool, kString, kList } kind = kInt;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
  // Behind a pointer: assigning a YAML::Node writes into the node it refers
  // to (here a param's list, shared with the block's definition).
  std::shared_ptr<const YAML::Node> list;

  double Number() const { return kind == kInt ? static_cast<double>(i) : f; }
  bool IsNumber() const { return kind == kInt || kind == kFloat; }
  std::string KindName() const {
    static const char* names[] = {"int", "float", "bool", "string", "list"};
    return names[kind];
  }
};

// A YAML scalar or list as a value (true/false, an int, a float, else a
// string).
Value FromNode(const YAML::Node& n);
// A value as a YAML node (floats keep a '.', so they stay floats).
YAML::Node ToNode(const Value& v);

// The params in scope, by name.
using Env = std::map<std::string, YAML::Node>;

// env[k] = v without yaml-cpp's assignment, which would write v into the
// node env[k] already refers to (a block's default, shared by every use).
inline void Bind(Env& env, const std::string& k, const YAML::Node& v) {
  env.erase(k);
  env.emplace(k, v);
}

// Evaluates `text`; a mistake is a ConfigError "<where>: in \"text\": ...".
Value Evaluate(const std::string& text, const Env& env, const std::string& where);

// "$name" and nothing else: its value keeps its YAML type (a list stays one).
bool IsBareParam(const std::string& s);

}  // namespace cnnflow::blocks
