#include "pipeline/yaml_util.h"

#include <cctype>
#include <fstream>
#include <sstream>

namespace cnnflow {

namespace {

// The end of the flow collection or scalar that starts at `pos` ('{', '[',
// a quote or a plain scalar), skipping nested collections and quotes.
size_t EndOfValue(const std::string& t, size_t pos) {
  if (t[pos] == '"' || t[pos] == '\'') {
    const char q = t[pos];
    for (size_t i = pos + 1; i < t.size(); ++i) {
      if (q == '"' && t[i] == '\\')
        ++i;
      else if (t[i] == q)
        return i + 1;
    }
    return t.size();
  }
  if (t[pos] == '{' || t[pos] == '[') {
    int depth = 0;
    for (size_t i = pos; i < t.size(); ++i) {
      const char c = t[i];
      if (c == '"' || c == '\'')
        i = EndOfValue(t, i) - 1;
      else if (c == '{' || c == '[')
        ++depth;
      else if ((c == '}' || c == ']') && --depth == 0)
        return i + 1;
    }
    return t.size();
  }
  size_t i = pos;  // plain scalar: up to a flow indicator, a comment or the line's end
  while (i < t.size() && t[i] != '\n' && t[i] != ',' && t[i] != '}' && t[i] != ']' &&
         !(t[i] == '#' && i > pos && t[i - 1] == ' '))
    ++i;
  while (i > pos && t[i - 1] == ' ') --i;
  return i;
}

}  // namespace

std::string SetYamlScalar(const std::string& text, const std::string& key, const std::string& value,
                          const std::string& name) {
  const auto dot = key.find('.');
  CNNFLOW_ENFORCE(dot != std::string::npos && key.find('.', dot + 1) == std::string::npos,
                  "expected section.name, got ", key);
  const std::string section = key.substr(0, dot), field = key.substr(dot + 1);
  const YamlDoc doc = YamlDoc::Parse(text, name);
  const YAML::Node sec = doc.root()[section];
  std::string out = text;
  if (!sec.IsDefined() || sec.IsNull()) {
    if (!out.empty() && out.back() != '\n') out += '\n';
    out += StrCat(section, ": {", field, ": ", value, "}\n");
  } else if (!sec.IsMap()) {
    doc.Fail(sec, section, "expected a mapping to set " + key + " in");
  } else if (const YAML::Node v = sec[field]; v.IsDefined()) {
    if (!v.IsScalar() && !v.IsNull()) doc.Fail(v, key, "expected a scalar to replace");
    const size_t pos = static_cast<size_t>(v.Mark().pos);
    out.replace(pos, EndOfValue(text, pos) - pos, value);
  } else {
    const size_t pos = static_cast<size_t>(sec.Mark().pos);
    if (text[pos] == '{') {  // flow mapping: add before its closing brace
      const size_t close = EndOfValue(text, pos) - 1;
      size_t last = close;
      while (last > pos + 1 && std::isspace(static_cast<unsigned char>(text[last - 1]))) --last;
      const bool empty = last == pos + 1;
      out.insert(last, StrCat(empty ? "" : ", ", field, ": ", value));
    } else {  // block mapping: a new first line at the keys' indentation
      const size_t column = static_cast<size_t>(sec.Mark().column);
      out.insert(pos - column, StrCat(std::string(column, ' '), field, ": ", value, "\n"));
    }
  }
  // The result must parse and hold the value.
  const YamlDoc check = YamlDoc::Parse(out, name);
  CNNFLOW_ENFORCE(
      check.root()[section][field].IsDefined() &&
          check.root()[section][field].as<std::string>() == YAML::Load(value).as<std::string>(),
      name, ": could not set ", key, " in the text");
  return out;
}

YamlDoc YamlDoc::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(StrCat(path, ": cannot open the file"));
  std::stringstream ss;
  ss << in.rdbuf();
  return Parse(ss.str(), path);
}

YamlDoc YamlDoc::Parse(const std::string& text, const std::string& name) {
  YamlDoc doc;
  doc.path_ = name;
  try {
    doc.root_ = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(
        StrCat(name, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML syntax error: ", e.msg));
  }
  if (!doc.root_.IsMap()) {
    throw ConfigError(StrCat(name, ": expected a mapping of keys at the top level"));
  }
  return doc;
}

void YamlDoc::Override(const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError(StrCat("--set ", assignment, ": expected key.path=value"));
  }
  const std::string key = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  YAML::Node value;
  try {
    value = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(StrCat("--set ", assignment, ": the value is not valid YAML: ", e.msg));
  }
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  // Walk down the tree; a number indexes a list (model.layers.0.name).
  std::vector<YAML::Node> chain{root_};
  auto child = [&](YAML::Node& parent, const std::string& part, bool create) -> YAML::Node {
    if (parent.IsSequence()) {
      char* end = nullptr;
      const long i = std::strtol(part.c_str(), &end, 10);
      if (part.empty() || *end != '\0' || i < 0 || static_cast<size_t>(i) >= parent.size()) {
        throw ConfigError(StrCat("--set ", assignment, ": '", part,
                                 "' is not an index of the list (size ", parent.size(), ")"));
      }
      return parent[static_cast<size_t>(i)];
    }
    if (!parent.IsMap()) {
      throw ConfigError(StrCat("--set ", assignment, ": cannot set '", part, "' inside a value"));
    }
    if (create && (!parent[part].IsDefined() || parent[part].IsNull())) {
      parent[part] = YAML::Node(YAML::NodeType::Map);
    }
    return parent[part];
  };
  for (size_t i = 0; i + 1 < parts.size(); ++i)
    chain.push_back(child(chain.back(), parts[i], true));
  YAML::Node& parent = chain.back();
  if (parent.IsSequence()) {
    YAML::Node target = child(parent, parts.back(), false);
    parent[static_cast<size_t>(std::stol(parts.back()))] = value;
  } else if (parent.IsMap()) {
    parent[parts.back()] = value;
  } else {
    throw ConfigError(
        StrCat("--set ", assignment, ": cannot set '", parts.back(), "' inside a value"));
  }
  YAML::Node set = parent.IsSequence() ? parent[static_cast<size_t>(std::stol(parts.back()))]
                                       : parent[parts.back()];
  overrides_.push_back({set, "--set " + assignment});
}

std::string YamlDoc::Where(const YAML::Node& node) const {
  for (const auto& o : overrides_)
    if (o.node.is(node)) return o.text;
  const YAML::Mark m = node.Mark();
  if (m.is_null()) return path_;
  return StrCat(path_, ":", m.line + 1, ":", m.column + 1);
}

void YamlDoc::Fail(const YAML::Node& node, const std::string& context,
                   const std::string& message) const {
  throw ConfigError(StrCat(Where(node), ": ", context, context.empty() ? "" : ": ", message));
}

namespace {

bool IsBool(const YAML::Node& n, bool* out) {
  if (!n.IsScalar()) return false;
  const std::string& s = n.Scalar();
  if (s == "true" || s == "True" || s == "yes") return *out = true, true;
  if (s == "false" || s == "False" || s == "no") return *out = false, true;
  return false;
}

bool IsInt(const YAML::Node& n, int64_t* out) {
  if (!n.IsScalar()) return false;
  const std::string& s = n.Scalar();
  if (s.empty()) return false;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (*end != '\0') return false;
  *out = v;
  return true;
}

bool IsFloat(const YAML::Node& n, double* out) {
  if (!n.IsScalar()) return false;
  const std::string& s = n.Scalar();
  if (s.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (*end != '\0') return false;
  *out = v;
  return true;
}

std::string Describe(const YAML::Node& n) {
  if (n.IsScalar()) return StrCat("'", n.Scalar(), "'");
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  return "nothing";
}

}  // namespace

std::string YamlDoc::Name(const YAML::Node& node, const std::string& context) const {
  if (!node.IsScalar()) Fail(node, context, StrCat("expected a name, got ", Describe(node)));
  return node.Scalar();
}

ParamValue YamlDoc::Value(const YAML::Node& node, const ParamSpec& spec,
                          const std::string& context) const {
  const std::string ctx = context.empty() ? StrCat("key '", spec.name, "'")
                                          : StrCat(context, ": key '", spec.name, "'");
  auto wrong = [&]() {
    Fail(node, ctx, StrCat("expected ", ParamTypeName(spec.type), ", got ", Describe(node)));
  };
  int64_t i;
  double d;
  bool b;
  switch (spec.type) {
    case ParamType::kInt:
      if (!IsInt(node, &i)) wrong();
      return i;
    case ParamType::kFloat:
      if (!IsFloat(node, &d)) wrong();
      return d;
    case ParamType::kBool:
      if (!IsBool(node, &b)) wrong();
      return b;
    case ParamType::kString: {
      if (!node.IsScalar()) wrong();
      std::string s = node.Scalar();
      // A choice that offers true and false (hflip: true | false | alternate)
      // takes YAML's other spellings of them (yes, True, ...) as a bool does.
      auto offers = [&](const char* c) {
        return std::find(spec.choices.begin(), spec.choices.end(), c) != spec.choices.end();
      };
      if (IsBool(node, &b) && offers("true") && offers("false")) s = b ? "true" : "false";
      if (!spec.choices.empty() &&
          std::find(spec.choices.begin(), spec.choices.end(), s) == spec.choices.end()) {
        Fail(node, ctx, UnknownNameMessage("value", s, spec.choices));
      }
      return s;
    }
    case ParamType::kIntList: {
      if (IsInt(node, &i)) return std::vector<int64_t>{i};
      if (!node.IsSequence()) wrong();
      std::vector<int64_t> v;
      for (const auto& e : node) {
        if (!IsInt(e, &i)) Fail(e, ctx, StrCat("expected an int, got ", Describe(e)));
        v.push_back(i);
      }
      return v;
    }
    case ParamType::kFloatList: {
      if (IsFloat(node, &d)) return std::vector<double>{d};
      if (!node.IsSequence()) wrong();
      std::vector<double> v;
      for (const auto& e : node) {
        if (!IsFloat(e, &d)) Fail(e, ctx, StrCat("expected a number, got ", Describe(e)));
        v.push_back(d);
      }
      return v;
    }
    case ParamType::kStringList: {
      if (node.IsScalar()) return std::vector<std::string>{node.Scalar()};
      if (!node.IsSequence()) wrong();
      std::vector<std::string> v;
      for (const auto& e : node) {
        if (!e.IsScalar()) Fail(e, ctx, StrCat("expected a string, got ", Describe(e)));
        v.push_back(e.Scalar());
      }
      return v;
    }
    case ParamType::kTree: {
      YAML::Emitter out;
      out << YAML::Flow << node;
      return std::string(out.c_str());
    }
  }
  wrong();
  return {};  // not reached: wrong() throws
}

Args YamlDoc::CheckArgs(const YAML::Node& map, const Schema& schema,
                        const std::string& context) const {
  Args args;
  if (map.IsDefined() && !map.IsNull()) {
    if (!map.IsMap())
      Fail(map, context, StrCat("expected a mapping of parameters, got ", Describe(map)));
    for (const auto& kv : map) {
      const std::string key = Name(kv.first, context);
      const ParamSpec* spec = schema.Find(key);
      if (spec == nullptr) {
        Fail(kv.first, context, UnknownNameMessage("key", key, schema.Names()));
      }
      args.Set(key, Value(kv.second, *spec, context));
    }
  }
  for (const auto& p : schema.params()) {
    if (!p.default_value && !args.Has(p.name)) {
      Fail(
          map, context,
          StrCat("missing required key '", p.name, "' (", ParamTypeName(p.type), ": ", p.doc, ")"));
    }
  }
  args.FillDefaults(schema);
  return args;
}

}  // namespace cnnflow
