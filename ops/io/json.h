// A small JSON value, parser and writer: what the safetensors header and the
// checkpoint sidecar need. Objects keep their insertion order (a written
// file reads back in the same order); numbers keep their literal text, so an
// int64 or uint64 (tensor offsets, seeds) survives exactly, not rounded
// through a double. Parse errors name the byte offset, line and column and
// what was expected there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/error.h"

namespace cnnflow {

// A malformed JSON text. offset() is the byte where parsing stopped.
class JsonError : public Error {
 public:
  JsonError(const std::string& what, size_t offset) : Error(what), offset_(offset) {}
  size_t offset() const { return offset_; }

 private:
  size_t offset_;
};

class Json {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  Json() = default;  // null
  static Json Bool(bool b);
  static Json Int(int64_t v);
  static Json Uint(uint64_t v);
  // The shortest text that reads back as the same double. Throws Error for
  // NaN and infinities, which JSON cannot hold.
  static Json Number(double v);
  static Json String(std::string s);
  static Json Array();
  static Json Object();

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::kNull; }
  bool is_number() const { return kind_ == Kind::kNumber; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }

  // Typed reads; each throws Error saying what was expected and what was
  // found ("expected an integer, got a string"). Callers add the key.
  bool AsBool() const;
  // Only integer literals (no fraction or exponent) in range.
  int64_t AsInt64() const;
  uint64_t AsUint64() const;
  double AsDouble() const;  // any number
  const std::string& AsString() const;
  // A number's literal text, as parsed or written.
  const std::string& number_text() const { return text_; }

  // Arrays.
  const std::vector<Json>& items() const { return items_; }
  std::vector<Json>& items() { return items_; }
  Json& Append(Json v);  // turns null into an array; returns the new item

  // Objects, in insertion order.
  const std::vector<std::pair<std::string, Json>>& members() const { return members_; }
  // nullptr when absent (or not an object).
  const Json* Find(const std::string& key) const;
  // Throws Error naming the key when absent.
  const Json& At(const std::string& key) const;
  // Replaces the value of `key` or appends it; turns null into an object.
  Json& Set(const std::string& key, Json v);

  // Elements of an array or members of an object; 0 otherwise.
  size_t size() const;

  bool operator==(const Json& o) const;

 private:
  Kind kind_ = Kind::kNull;
  bool bool_ = false;
  std::string text_;  // a string's value or a number's literal
  std::vector<Json> items_;
  std::vector<std::pair<std::string, Json>> members_;

  friend class JsonParser;
};

// "null", "a boolean", "a number", "a string", "an array", "an object".
const char* JsonKindName(Json::Kind kind);

// Parses a whole text as one JSON value (RFC 8259; whitespace around it
// allowed). Rejects duplicate object keys, unpaired surrogates, control
// characters in strings, nesting deeper than 256, and trailing text.
// Throws JsonError: "JSON at byte 12 (line 2, column 3): expected ':' after
// an object key, got '}'".
Json ParseJson(const std::string& text);

// Writes `v` as JSON text: compact when indent < 0, else pretty with
// `indent` spaces per level. Strings are escaped ('"', '\\', control
// characters); other bytes (UTF-8) pass through.
std::string WriteJson(const Json& v, int indent = -1);

// Appends `s` as a JSON string literal, quotes included.
void AppendJsonString(std::string& out, const std::string& s);

}  // namespace cnnflow
