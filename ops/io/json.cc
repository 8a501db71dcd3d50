// Why our own parser and writer, not nlohmann-json (Debian's
// nlohmann-json3-dev), measured on a safetensors header of 1000 tensors
// (bench/results/2026-12-01-io-libraries.txt): nlohmann's ordered_json (the
// member order the safetensors header and the checkpoint sidecar keep)
// parses 3-4.6x slower and writes 1.35-7x slower. Its SAX tokenizer alone
// costs 0.55-0.7x of our whole parse; a parser on it would still give up
// what json.h promises: each error's byte, line and column with what was
// expected there, a duplicate key named at its offset, and every number's
// literal text.
#include "ops/io/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <system_error>

namespace cnnflow {

// ------------------------------------------------------------------ value

Json Json::Bool(bool b) {
  Json v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  return v;
}

Json Json::Int(int64_t x) {
  Json v;
  v.kind_ = Kind::kNumber;
  v.text_ = std::to_string(x);
  return v;
}

Json Json::Uint(uint64_t x) {
  Json v;
  v.kind_ = Kind::kNumber;
  v.text_ = std::to_string(x);
  return v;
}

Json Json::Number(double x) {
  if (!std::isfinite(x)) throw Error(StrCat("JSON cannot hold the number ", x));
  // std::to_chars gives the shortest round-trip form and, unlike printf,
  // ignores the C locale's decimal separator.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  Json v;
  v.kind_ = Kind::kNumber;
  v.text_.assign(buf, r.ptr);
  return v;
}

Json Json::String(std::string s) {
  Json v;
  v.kind_ = Kind::kString;
  v.text_ = std::move(s);
  return v;
}

Json Json::Array() {
  Json v;
  v.kind_ = Kind::kArray;
  return v;
}

Json Json::Object() {
  Json v;
  v.kind_ = Kind::kObject;
  return v;
}

const char* JsonKindName(Json::Kind kind) {
  switch (kind) {
    case Json::Kind::kNull:
      return "null";
    case Json::Kind::kBool:
      return "a boolean";
    case Json::Kind::kNumber:
      return "a number";
    case Json::Kind::kString:
      return "a string";
    case Json::Kind::kArray:
      return "an array";
    case Json::Kind::kObject:
      return "an object";
  }
  return "?";
}

namespace {

[[noreturn]] void WrongKind(const char* expected, const Json& v) {
  throw Error(StrCat("expected ", expected, ", got ", JsonKindName(v.kind()),
                     v.is_number() ? StrCat(" (", v.number_text(), ")") : std::string()));
}

bool IsIntegerLiteral(const std::string& t) { return t.find_first_of(".eE") == std::string::npos; }

}  // namespace

bool Json::AsBool() const {
  if (kind_ != Kind::kBool) WrongKind("a boolean", *this);
  return bool_;
}

int64_t Json::AsInt64() const {
  if (kind_ != Kind::kNumber || !IsIntegerLiteral(text_)) WrongKind("an integer", *this);
  int64_t x = 0;
  const auto r = std::from_chars(text_.data(), text_.data() + text_.size(), x);
  if (r.ec != std::errc() || r.ptr != text_.data() + text_.size()) {
    throw Error(StrCat("integer ", text_, " does not fit 64 bits"));
  }
  return x;
}

uint64_t Json::AsUint64() const {
  if (kind_ != Kind::kNumber || !IsIntegerLiteral(text_) || text_[0] == '-') {
    WrongKind("a non-negative integer", *this);
  }
  uint64_t x = 0;
  const auto r = std::from_chars(text_.data(), text_.data() + text_.size(), x);
  if (r.ec != std::errc() || r.ptr != text_.data() + text_.size()) {
    throw Error(StrCat("integer ", text_, " does not fit 64 bits"));
  }
  return x;
}

double Json::AsDouble() const {
  if (kind_ != Kind::kNumber) WrongKind("a number", *this);
  double x = 0;
  const auto r = std::from_chars(text_.data(), text_.data() + text_.size(), x);
  // Out of range (1e999) reads as an error rather than infinity.
  if (r.ec != std::errc() || r.ptr != text_.data() + text_.size()) {
    throw Error(StrCat("number ", text_, " is out of the range of a double"));
  }
  return x;
}

const std::string& Json::AsString() const {
  if (kind_ != Kind::kString) WrongKind("a string", *this);
  return text_;
}

Json& Json::Append(Json v) {
  if (kind_ == Kind::kNull) kind_ = Kind::kArray;
  if (kind_ != Kind::kArray) WrongKind("an array", *this);
  items_.push_back(std::move(v));
  return items_.back();
}

const Json* Json::Find(const std::string& key) const {
  for (const auto& [k, v] : members_)
    if (k == key) return &v;
  return nullptr;
}

const Json& Json::At(const std::string& key) const {
  if (kind_ != Kind::kObject) WrongKind("an object", *this);
  const Json* v = Find(key);
  if (v == nullptr) throw Error(StrCat("missing key \"", key, "\""));
  return *v;
}

Json& Json::Set(const std::string& key, Json v) {
  if (kind_ == Kind::kNull) kind_ = Kind::kObject;
  if (kind_ != Kind::kObject) WrongKind("an object", *this);
  for (auto& [k, old] : members_) {
    if (k == key) {
      old = std::move(v);
      return old;
    }
  }
  members_.emplace_back(key, std::move(v));
  return members_.back().second;
}

size_t Json::size() const {
  if (kind_ == Kind::kArray) return items_.size();
  if (kind_ == Kind::kObject) return members_.size();
  return 0;
}

// Numbers compare by their literal text, so 1 and 1.0 differ (as their
// writers meant them to).
bool Json::operator==(const Json& o) const {
  return kind_ == o.kind_ && bool_ == o.bool_ && text_ == o.text_ && items_ == o.items_ &&
         members_ == o.members_;
}

// ------------------------------------------------------------------ parser

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}

  Json ParseDocument() {
    Json v = ParseValue(0);
    SkipSpace();
    if (pos_ != s_.size()) Fail("unexpected text after the JSON value");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 256;

  // What is at pos_, for "got ..." in messages.
  std::string Got() const {
    if (pos_ >= s_.size()) return "the end of the text";
    const unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c < 0x20 || c >= 0x7f) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "byte 0x%02x", c);
      return buf;
    }
    return StrCat("'", static_cast<char>(c), "'");
  }

  [[noreturn]] void Fail(const std::string& what) const { FailAt(pos_, what); }

  [[noreturn]] void FailAt(size_t at, const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw JsonError(StrCat("JSON at byte ", at, " (line ", line, ", column ", col, "): ", what),
                    at);
  }

  [[noreturn]] void Expected(const std::string& what) const {
    Fail(StrCat("expected ", what, ", got ", Got()));
  }

  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }

  bool At(char c) const { return pos_ < s_.size() && s_[pos_] == c; }

  bool Consume(const char* word) {
    const size_t n = std::strlen(word);
    if (s_.compare(pos_, n, word) != 0) return false;
    pos_ += n;
    return true;
  }

  Json ParseValue(int depth) {
    if (depth > kMaxDepth) Fail(StrCat("nested too deeply (more than ", kMaxDepth, " levels)"));
    SkipSpace();
    if (pos_ >= s_.size()) Expected("a value");
    const char c = s_[pos_];
    if (c == '{') return ParseObject(depth);
    if (c == '[') return ParseArray(depth);
    if (c == '"') return Json::String(ParseString());
    if (Consume("true")) return Json::Bool(true);
    if (Consume("false")) return Json::Bool(false);
    if (Consume("null")) return Json();
    if (c == '-' || (c >= '0' && c <= '9')) {
      Json v;
      v.kind_ = Json::Kind::kNumber;
      v.text_ = ParseNumber();
      return v;
    }
    Expected("a value");
  }

  Json ParseObject(int depth) {
    Json v = Json::Object();
    ++pos_;
    SkipSpace();
    if (At('}')) {
      ++pos_;
      return v;
    }
    std::set<std::string> keys;
    while (true) {
      SkipSpace();
      if (!At('"')) Expected("a string key");
      const size_t key_at = pos_;
      std::string key = ParseString();
      if (!keys.insert(key).second) FailAt(key_at, StrCat("duplicate key \"", key, "\""));
      SkipSpace();
      if (!At(':')) Expected("':' after an object key");
      ++pos_;
      v.members_.emplace_back(std::move(key), ParseValue(depth + 1));
      SkipSpace();
      if (At(',')) {
        ++pos_;
        continue;
      }
      if (At('}')) {
        ++pos_;
        return v;
      }
      Expected("',' or '}' in an object");
    }
  }

  Json ParseArray(int depth) {
    Json v = Json::Array();
    ++pos_;
    SkipSpace();
    if (At(']')) {
      ++pos_;
      return v;
    }
    while (true) {
      v.items_.push_back(ParseValue(depth + 1));
      SkipSpace();
      if (At(',')) {
        ++pos_;
        continue;
      }
      if (At(']')) {
        ++pos_;
        return v;
      }
      Expected("',' or ']' in an array");
    }
  }

  bool IsDigit() const { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; }

  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  std::string ParseNumber() {
    const size_t start = pos_;
    if (s_[pos_] == '-') ++pos_;
    if (!IsDigit()) Expected("a digit");
    if (s_[pos_] == '0') {
      ++pos_;
    } else {
      while (IsDigit()) ++pos_;
    }
    if (At('.')) {
      ++pos_;
      if (!IsDigit()) Expected("a digit after '.'");
      while (IsDigit()) ++pos_;
    }
    if (At('e') || At('E')) {
      ++pos_;
      if (At('+') || At('-')) ++pos_;
      if (!IsDigit()) Expected("a digit in the exponent");
      while (IsDigit()) ++pos_;
    }
    return s_.substr(start, pos_ - start);
  }

  unsigned Hex4() {
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      if (pos_ >= s_.size()) Expected("4 hex digits after \\u");
      const char h = s_[pos_];
      v <<= 4;
      if (h >= '0' && h <= '9') {
        v |= h - '0';
      } else if (h >= 'a' && h <= 'f') {
        v |= h - 'a' + 10;
      } else if (h >= 'A' && h <= 'F') {
        v |= h - 'A' + 10;
      } else {
        Expected("a hex digit in a \\u escape");
      }
      ++pos_;
    }
    return v;
  }

  static void AppendUtf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // At the opening quote; returns the decoded string (UTF-8).
  std::string ParseString() {
    const size_t open = pos_++;
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) FailAt(open, "unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) Fail(StrCat("control character (", Got(), ") in a string; escape it"));
      ++pos_;
      if (c != '\\') {
        out += static_cast<char>(c);
        continue;
      }
      if (pos_ >= s_.size()) FailAt(open, "unterminated string");
      const char e = s_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          const size_t esc = pos_ - 2;
          unsigned cp = Hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (!Consume("\\u")) FailAt(esc, "high surrogate without a low one after it");
            const unsigned lo = Hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) FailAt(esc, "high surrogate followed by a non-low one");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            FailAt(esc, "low surrogate without a high one before it");
          }
          AppendUtf8(out, cp);
          break;
        }
        default:
          --pos_;
          Fail(StrCat("bad escape '\\", e,
                      "' (expected one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u)"));
      }
    }
  }

  const std::string& s_;
  size_t pos_ = 0;
};

Json ParseJson(const std::string& text) { return JsonParser(text).ParseDocument(); }

// ------------------------------------------------------------------ writer

void AppendJsonString(std::string& out, const std::string& s) {
  out += '"';
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;  // UTF-8 bytes pass through
        }
    }
  }
  out += '"';
}

namespace {

void Newline(std::string& out, int indent, int depth) {
  if (indent < 0) return;
  out += '\n';
  out.append(static_cast<size_t>(indent) * depth, ' ');
}

void Write(std::string& out, const Json& v, int indent, int depth) {
  switch (v.kind()) {
    case Json::Kind::kNull:
      out += "null";
      return;
    case Json::Kind::kBool:
      out += v.AsBool() ? "true" : "false";
      return;
    case Json::Kind::kNumber:
      out += v.number_text();
      return;
    case Json::Kind::kString:
      AppendJsonString(out, v.AsString());
      return;
    case Json::Kind::kArray: {
      out += '[';
      bool first = true;
      for (const Json& item : v.items()) {
        if (!first) out += ',';
        first = false;
        Newline(out, indent, depth + 1);
        Write(out, item, indent, depth + 1);
      }
      if (!v.items().empty()) Newline(out, indent, depth);
      out += ']';
      return;
    }
    case Json::Kind::kObject: {
      out += '{';
      bool first = true;
      for (const auto& [key, value] : v.members()) {
        if (!first) out += ',';
        first = false;
        Newline(out, indent, depth + 1);
        AppendJsonString(out, key);
        out += indent < 0 ? ":" : ": ";
        Write(out, value, indent, depth + 1);
      }
      if (!v.members().empty()) Newline(out, indent, depth);
      out += '}';
      return;
    }
  }
}

}  // namespace

std::string WriteJson(const Json& v, int indent) {
  std::string out;
  Write(out, v, indent, 0);
  return out;
}

}  // namespace cnnflow
