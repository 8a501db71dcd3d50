#include "pipeline/block_expression.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ops/error.h"
#include "pipeline/yaml_util.h"

namespace cnnflow::blocks {

Value FromNode(const YAML::Node& n) {
  Value v;
  if (n.IsSequence()) {
    v.kind = Value::kList;
    v.list = std::make_shared<const YAML::Node>(n);
    return v;
  }
  const std::string t = n.IsScalar() ? n.Scalar() : std::string();
  if (t == "true" || t == "false") {
    v.kind = Value::kBool;
    v.b = t == "true";
    return v;
  }
  char* end = nullptr;
  const long long iv = std::strtoll(t.c_str(), &end, 10);
  if (!t.empty() && *end == '\0') {
    v.kind = Value::kInt;
    v.i = iv;
    return v;
  }
  const double fv = std::strtod(t.c_str(), &end);
  if (!t.empty() && *end == '\0') {
    v.kind = Value::kFloat;
    v.f = fv;
    return v;
  }
  v.kind = Value::kString;
  v.s = t;
  return v;
}

YAML::Node ToNode(const Value& v) {
  switch (v.kind) {
    case Value::kInt:
      return YAML::Node(std::to_string(v.i));
    case Value::kFloat: {
      char buf[40];
      std::snprintf(buf, sizeof buf, "%.17g", v.f);
      std::string s = buf;
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
      return YAML::Node(s);
    }
    case Value::kBool:
      return YAML::Node(v.b ? "true" : "false");
    case Value::kString:
      return YAML::Node(v.s);
    case Value::kList:
      return *v.list;
  }
  return YAML::Node();
}

namespace {

// A recursive-descent evaluator of the small expression language of
// model_blocks.h. Errors throw ConfigError with `where` in front.
class Expression {
 public:
  Expression(const std::string& text, const Env& env, std::string where)
      : t_(text), env_(env), where_(std::move(where)) {}

  Value Evaluate() {
    Value v = Ternary();
    Skip();
    if (p_ != t_.size()) Fail(StrCat("unexpected '", t_.substr(p_), "'"));
    return v;
  }

 private:
  [[noreturn]] void Fail(const std::string& msg) const {
    throw ConfigError(StrCat(where_, ": in \"", t_, "\": ", msg));
  }
  void Skip() {
    while (p_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[p_]))) ++p_;
  }
  bool Eat(const std::string& op) {
    Skip();
    if (t_.compare(p_, op.size(), op) != 0) return false;
    // A word operator must end at a word boundary ("not", "and", "or").
    if (std::isalpha(static_cast<unsigned char>(op[0])) && p_ + op.size() < t_.size() &&
        (std::isalnum(static_cast<unsigned char>(t_[p_ + op.size()])) || t_[p_ + op.size()] == '_'))
      return false;
    p_ += op.size();
    return true;
  }
  bool Truth(const Value& v) const {
    if (v.kind != Value::kBool) Fail(StrCat("expected a bool, got ", v.KindName()));
    return v.b;
  }
  Value Bool(bool b) const {
    Value v;
    v.kind = Value::kBool;
    v.b = b;
    return v;
  }

  Value Ternary() {
    Value c = Or();
    if (!Eat("?")) return c;
    Value a = Ternary();
    if (!Eat(":")) Fail("expected ':' of 'cond ? a : b'");
    Value b = Ternary();
    return Truth(c) ? a : b;
  }
  Value Or() {
    Value a = And();
    while (Eat("or")) {
      Value b = And();
      a = Bool(Truth(a) || Truth(b));
    }
    return a;
  }
  Value And() {
    Value a = Not();
    while (Eat("and")) {
      Value b = Not();
      a = Bool(Truth(a) && Truth(b));
    }
    return a;
  }
  Value Not() {
    if (Eat("not")) return Bool(!Truth(Not()));
    return Compare();
  }
  Value Compare() {
    Value a = Sum();
    for (const char* op : {"==", "!=", "<=", ">=", "<", ">"}) {
      if (!Eat(op)) continue;
      Value b = Sum();
      const std::string o = op;
      if (a.IsNumber() && b.IsNumber()) {
        const double x = a.Number(), y = b.Number();
        return Bool(o == "=="   ? x == y
                    : o == "!=" ? x != y
                    : o == "<=" ? x <= y
                    : o == ">=" ? x >= y
                    : o == "<"  ? x < y
                                : x > y);
      }
      if (o != "==" && o != "!=") Fail(StrCat("'", o, "' compares numbers, got ", a.KindName()));
      const bool eq = a.kind == b.kind && ToNode(a).Scalar() == ToNode(b).Scalar();
      return Bool(o == "==" ? eq : !eq);
    }
    return a;
  }
  Value Arith(const Value& a, const Value& b, const std::string& op) const {
    if (!a.IsNumber() || !b.IsNumber()) {
      if (op == "+" && (a.kind == Value::kString || b.kind == Value::kString)) {
        Value v;  // concatenation; a number joins as its text ('block.' + 2)
        v.kind = Value::kString;
        v.s = ToNode(a).Scalar() + ToNode(b).Scalar();
        return v;
      }
      Fail(StrCat("'", op, "' takes numbers, got ", a.KindName(), " and ", b.KindName()));
    }
    Value v;
    if (op == "/") {
      if (b.Number() == 0) Fail("division by zero");
      v.kind = Value::kFloat;
      v.f = a.Number() / b.Number();
      return v;
    }
    if (a.kind == Value::kInt && b.kind == Value::kInt) {
      v.kind = Value::kInt;
      if ((op == "//" || op == "%") && b.i == 0) Fail("division by zero");
      v.i = op == "+"    ? a.i + b.i
            : op == "-"  ? a.i - b.i
            : op == "*"  ? a.i * b.i
            : op == "//" ? (a.i - ((a.i % b.i) + b.i) % b.i) / b.i
                         : ((a.i % b.i) + b.i) % b.i;
      return v;
    }
    v.kind = Value::kFloat;
    const double x = a.Number(), y = b.Number();
    v.f = op == "+"    ? x + y
          : op == "-"  ? x - y
          : op == "*"  ? x * y
          : op == "//" ? std::floor(x / y)
                       : x - std::floor(x / y) * y;
    if (op == "//") {  // floor division of floats gives an int, as int(x // y) would
      v.kind = Value::kInt;
      v.i = static_cast<int64_t>(v.f);
    }
    return v;
  }
  Value Sum() {
    Value a = Product();
    for (;;) {
      if (Eat("+"))
        a = Arith(a, Product(), "+");
      else if (Eat("-"))
        a = Arith(a, Product(), "-");
      else
        return a;
    }
  }
  Value Product() {
    Value a = Unary();
    for (;;) {
      if (Eat("//"))
        a = Arith(a, Unary(), "//");
      else if (Eat("*"))
        a = Arith(a, Unary(), "*");
      else if (Eat("/"))
        a = Arith(a, Unary(), "/");
      else if (Eat("%"))
        a = Arith(a, Unary(), "%");
      else
        return a;
    }
  }
  Value Unary() {
    if (Eat("-")) {
      Value zero;
      return Arith(zero, Unary(), "-");
    }
    return Postfix();
  }
  Value Postfix() {
    Value v = Atom();
    while (Eat("[")) {
      Value k = Ternary();
      if (!Eat("]")) Fail("expected ']'");
      if (v.kind != Value::kList) Fail(StrCat("only a list can be indexed, got ", v.KindName()));
      if (k.kind != Value::kInt) Fail("a list index must be an int");
      const YAML::Node& list = *v.list;
      const int64_t n = static_cast<int64_t>(list.size());
      if (k.i < -n || k.i >= n) Fail(StrCat("index ", k.i, " out of range (", n, " items)"));
      v = FromNode(list[static_cast<size_t>(k.i < 0 ? k.i + n : k.i)]);
    }
    return v;
  }
  Value Atom() {
    Skip();
    if (p_ >= t_.size()) Fail("unexpected end");
    const char c = t_[p_];
    if (Eat("(")) {
      Value v = Ternary();
      if (!Eat(")")) Fail("expected ')'");
      return v;
    }
    if (c == '\'' || c == '"') {
      const size_t end = t_.find(c, p_ + 1);
      if (end == std::string::npos) Fail("unterminated string");
      Value v;
      v.kind = Value::kString;
      v.s = t_.substr(p_ + 1, end - p_ - 1);
      p_ = end + 1;
      return v;
    }
    if (c == '$') {
      ++p_;
      const size_t b = p_;
      while (p_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[p_])) || t_[p_] == '_'))
        ++p_;
      const std::string name = t_.substr(b, p_ - b);
      auto it = env_.find(name);
      if (it == env_.end()) {
        std::vector<std::string> known;
        for (const auto& kv : env_) known.push_back(kv.first);
        Fail(UnknownNameMessage("param", name, known));
      }
      return FromNode(it->second);
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      const size_t b = p_;
      while (p_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[p_])) || t_[p_] == '.' ||
                                ((t_[p_] == '-' || t_[p_] == '+') && (t_[p_ - 1] == 'e'))))
        ++p_;
      Value v = FromNode(YAML::Node(t_.substr(b, p_ - b)));
      if (!v.IsNumber()) Fail(StrCat("'", t_.substr(b, p_ - b), "' is not a number"));
      return v;
    }
    if (Eat("true")) return Bool(true);
    if (Eat("false")) return Bool(false);
    if (std::isalpha(static_cast<unsigned char>(c))) return Call();
    Fail(StrCat("unexpected '", t_.substr(p_), "' (a param is written $name, a string 'text')"));
  }

  // The builtins: int, round, ceil, floor (a number -> an int), min, max,
  // and make_divisible(v, d): torchvision's _make_divisible (v rounded to
  // a multiple of d, at least d, never below 90% of v).
  Value Call() {
    const size_t b = p_;
    while (p_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[p_])) || t_[p_] == '_'))
      ++p_;
    const std::string fn = t_.substr(b, p_ - b);
    static const std::vector<std::string> known = {"int", "round", "ceil",          "floor",
                                                   "min", "max",   "make_divisible"};
    if (std::find(known.begin(), known.end(), fn) == known.end()) {
      Fail(UnknownNameMessage("function", fn, known));
    }
    if (!Eat("(")) Fail(StrCat("expected '(' after ", fn));
    std::vector<Value> a;
    if (!Eat(")")) {
      do a.push_back(Ternary());
      while (Eat(","));
      if (!Eat(")")) Fail(StrCat("expected ')' closing ", fn, "("));
    }
    const size_t want = fn == "min" || fn == "max" || fn == "make_divisible" ? 2 : 1;
    if (a.size() != want) Fail(StrCat(fn, " takes ", want, " arguments, got ", a.size()));
    for (const Value& v : a)
      if (!v.IsNumber()) Fail(StrCat(fn, " takes numbers, got ", v.KindName()));
    Value r;
    r.kind = Value::kInt;
    const double x = a[0].Number();
    if (fn == "int") r.i = static_cast<int64_t>(x);  // toward zero, as Python's int()
    if (fn == "round") r.i = static_cast<int64_t>(std::nearbyint(x));  // ties to even, as Python's
    if (fn == "ceil") r.i = static_cast<int64_t>(std::ceil(x));
    if (fn == "floor") r.i = static_cast<int64_t>(std::floor(x));
    if (fn == "min" || fn == "max") {
      const bool first =
          fn == "min" ? a[0].Number() <= a[1].Number() : a[0].Number() >= a[1].Number();
      return first ? a[0] : a[1];
    }
    if (fn == "make_divisible") {
      const double d = a[1].Number();
      if (d <= 0) Fail("make_divisible: the divisor must be > 0");
      double v = std::max(d, std::floor((x + d / 2) / d) * d);
      if (v < 0.9 * x) v += d;
      r.i = static_cast<int64_t>(v);
    }
    return r;
  }

  const std::string& t_;
  const Env& env_;
  std::string where_;
  size_t p_ = 0;
};

}  // namespace

Value Evaluate(const std::string& text, const Env& env, const std::string& where) {
  return Expression(text, env, where).Evaluate();
}

bool IsBareParam(const std::string& s) {
  if (s.size() < 2 || s[0] != '$') return false;
  for (size_t i = 1; i < s.size(); ++i)
    if (!std::isalnum(static_cast<unsigned char>(s[i])) && s[i] != '_') return false;
  return true;
}

}  // namespace cnnflow::blocks
