// ops/io/json.h: compact and pretty output, exact numbers, escapes, and parse
// errors that name the offset and what was expected.
#include "ops/io/json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

namespace cnnflow {
namespace {

TEST(Json, WritesCompactAndPrettyAndReadsBoth) {
  Json v = Json::Object();
  v.Set("z", Json::Int(-7));
  v.Set("a", Json::Array());
  v.Set("list", Json::Array()).Append(Json::Bool(true));
  Json& list = v.Set("list", Json::Array());  // replaces in place, keeps the position
  list.Append(Json::Bool(false));
  list.Append(Json());
  list.Append(Json::Number(0.5));
  list.Append(Json::Object()).Set("k", Json::String("v"));
  v.Set("big", Json::Uint(18446744073709551615ULL));

  const std::string compact = WriteJson(v);
  EXPECT_EQ(compact,
            R"({"z":-7,"a":[],"list":[false,null,0.5,{"k":"v"}],"big":18446744073709551615})");
  const std::string pretty = WriteJson(v, 2);
  EXPECT_EQ(pretty,
            "{\n  \"z\": -7,\n  \"a\": [],\n  \"list\": [\n    false,\n    null,\n    0.5,\n"
            "    {\n      \"k\": \"v\"\n    }\n  ],\n  \"big\": 18446744073709551615\n}");
  EXPECT_EQ(ParseJson(compact), v);
  EXPECT_EQ(ParseJson(pretty), v);
  // Insertion order, not sorted.
  const Json back = ParseJson(compact);
  ASSERT_EQ(back.members().size(), 4u);
  EXPECT_EQ(back.members()[0].first, "z");
  EXPECT_EQ(back.members()[3].first, "big");
  EXPECT_EQ(back.At("big").AsUint64(), 18446744073709551615ULL);
  EXPECT_EQ(back.Find("absent"), nullptr);
}

TEST(Json, NumbersRoundTripExactly) {
  const int64_t ints[] = {0, -1, std::numeric_limits<int64_t>::min(),
                          std::numeric_limits<int64_t>::max(), 9007199254740993LL};
  for (const int64_t x : ints) {
    EXPECT_EQ(ParseJson(WriteJson(Json::Int(x))).AsInt64(), x);
  }
  const double doubles[] = {0.1,
                            1.0 / 3.0,
                            -2.5e-300,
                            5e-324,  // the smallest denormal
                            std::numeric_limits<double>::max(),
                            123456789.123456789,
                            1e22,
                            -0.0};
  for (const double x : doubles) {
    const std::string text = WriteJson(Json::Number(x));
    const double back = ParseJson(text).AsDouble();
    EXPECT_EQ(std::memcmp(&back, &x, sizeof x), 0) << text;
    // And the C library reads the same text to the same double.
    const double libc = std::strtod(text.c_str(), nullptr);
    EXPECT_EQ(std::memcmp(&libc, &x, sizeof x), 0) << text;
  }
  EXPECT_THROW(Json::Number(std::nan("")), Error);
  EXPECT_THROW(Json::Number(INFINITY), Error);

  // Reading a number as the wrong kind of integer says what it is.
  auto error_of = [](auto fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(
      error_of([] { ParseJson("1.5").AsInt64(); }).find("expected an integer, got a number (1.5)"),
      std::string::npos);
  EXPECT_NE(error_of([] { ParseJson("-1").AsUint64(); }).find("non-negative"), std::string::npos);
  EXPECT_NE(error_of([] { ParseJson("18446744073709551616").AsUint64(); }).find("64 bits"),
            std::string::npos);
  EXPECT_NE(error_of([] { ParseJson("9223372036854775808").AsInt64(); }).find("64 bits"),
            std::string::npos);
  EXPECT_NE(error_of([] { ParseJson("1e999").AsDouble(); }).find("out of the range"),
            std::string::npos);
  EXPECT_NE(error_of([] { ParseJson("\"7\"").AsInt64(); }).find("got a string"), std::string::npos);
  EXPECT_NE(error_of([] { ParseJson("{}").At("epoch"); }).find("missing key \"epoch\""),
            std::string::npos);
}

TEST(Json, EscapesStringsBothWays) {
  const std::string raw = std::string("q\"b\\s/n\nt\tr\rb\bf\f") + '\x01' + '\x1f' + '\x7f' +
                          "\xc3\xa9\xf0\x9f\x98\x80";
  const std::string written = WriteJson(Json::String(raw));
  EXPECT_EQ(written,
            "\"q\\\"b\\\\s/n\\nt\\tr\\rb\\bf\\f\\u0001\\u001f\\u007f\xc3\xa9\xf0\x9f\x98\x80\"");
  EXPECT_EQ(ParseJson(written).AsString(), raw);
  // \u escapes, surrogate pairs included, decode to UTF-8.
  EXPECT_EQ(ParseJson(R"("\u00e9\ud83d\ude00\/\u0041")").AsString(), "\xc3\xa9\xf0\x9f\x98\x80/A");
  // Keys are escaped too.
  Json o = Json::Object();
  o.Set("a\"b", Json::Int(1));
  EXPECT_EQ(WriteJson(o), R"({"a\"b":1})");
  EXPECT_EQ(ParseJson(WriteJson(o)), o);
}

TEST(Json, ErrorsNameTheOffsetAndWhatWasExpected) {
  struct Case {
    std::string text;
    size_t offset;
    std::string expect;
  };
  const Case cases[] = {
      {R"({"a" 1})", 5, "expected ':' after an object key, got '1'"},
      {"[1,]", 3, "expected a value, got ']'"},
      {R"({"a":1,"a":2})", 7, "duplicate key \"a\""},
      {"\"abc", 0, "unterminated string"},
      {"[1] x", 4, "unexpected text after the JSON value"},
      {R"("\q")", 2, "bad escape '\\q'"},
      {"{\"a\":1 \"b\":2}", 7, "expected ',' or '}' in an object, got '\"'"},
      {"[1 2]", 3, "expected ',' or ']' in an array"},
      {"-", 1, "expected a digit, got the end of the text"},
      {"1.e5", 2, "expected a digit after '.'"},
      {R"("\udc00")", 1, "low surrogate without a high one"},
      {R"("\ud800x")", 1, "high surrogate without a low one"},
      {R"("\u12G4")", 5, "expected a hex digit"},
      {"\"a\x01\"", 2, "control character (byte 0x01)"},
      {"", 0, "expected a value, got the end of the text"},
      {"{\"x\": tru}", 6, "expected a value, got 't'"},
  };
  for (const Case& c : cases) {
    try {
      ParseJson(c.text);
      ADD_FAILURE() << "no error for " << c.text;
    } catch (const JsonError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.offset(), c.offset) << c.text << " -> " << msg;
      EXPECT_NE(msg.find(StrCat("at byte ", c.offset, " ")), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.expect), std::string::npos) << c.text << " -> " << msg;
    }
  }
  // Line and column for a multi-line text: 'tru' starts line 3, column 8.
  try {
    ParseJson("{\n  \"a\": 1,\n  \"b\": tru\n}");
    FAIL() << "no error";
  } catch (const JsonError& e) {
    EXPECT_NE(std::string(e.what()).find("(line 3, column 8)"), std::string::npos) << e.what();
  }
  // Deep nesting is an error, not a stack overflow.
  EXPECT_THROW(ParseJson(std::string(100000, '[')), JsonError);
  EXPECT_NO_THROW(ParseJson(std::string(200, '[') + std::string(200, ']')));
}

}  // namespace
}  // namespace cnnflow
