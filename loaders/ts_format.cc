#include "loaders/ts_format.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "ops/error.h"

namespace cnnflow {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Whitespace-separated tokens.
std::vector<std::string_view> Tokens(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    const size_t start = i;
    while (i < s.size() && !std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    if (i > start) out.push_back(s.substr(start, i - start));
  }
  return out;
}

// Splits on `sep`, keeping empty pieces.
std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    const size_t at = s.find(sep, start);
    out.push_back(
        s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return out;
    start = at + 1;
  }
}

// Fills NaNs of one channel (see the header): linear between known
// neighbours, the nearest known value at the ends, 0 if none is known.
void FillMissing(float* x, int64_t n) {
  int64_t prev = -1;  // last known index
  for (int64_t i = 0; i <= n; ++i) {
    if (i < n && std::isnan(x[i])) continue;
    // Gap (prev, i) of missing values.
    if (i - prev > 1) {
      for (int64_t j = prev + 1; j < i; ++j) {
        if (prev < 0 && i >= n) {
          x[j] = 0.f;
        } else if (prev < 0) {
          x[j] = x[i];
        } else if (i >= n) {
          x[j] = x[prev];
        } else {
          const double t = static_cast<double>(j - prev) / static_cast<double>(i - prev);
          x[j] = static_cast<float>(x[prev] + t * (static_cast<double>(x[i]) - x[prev]));
        }
      }
    }
    prev = i;
  }
}

class TsParser {
 public:
  TsParser(std::string_view text, const std::string& path) : text_(text) { f_.path = path; }

  TsFile Parse() {
    size_t pos = 0;
    int64_t line_no = 0;
    while (pos < text_.size()) {
      size_t end = text_.find('\n', pos);
      if (end == std::string_view::npos) end = text_.size();
      ++line_no;
      line_ = line_no;
      ParseLine(Trim(text_.substr(pos, end - pos)));
      pos = end + 1;
    }
    if (!in_data_) throw Error(StrCat(f_.path, ": no @data line (is this a .ts file?)"));
    if (f_.cases.empty()) throw Error(StrCat(f_.path, ": no cases after @data"));
    return std::move(f_);
  }

 private:
  template <typename... Args>
  [[noreturn]] void Fail(Args&&... args) const {
    throw Error(StrCat(f_.path, ":", line_, ": ", std::forward<Args>(args)...));
  }

  bool Bool(std::string_view key, const std::vector<std::string_view>& tok) const {
    const std::string v = tok.size() > 1 ? Lower(tok[1]) : "";
    if (v == "true") return true;
    if (v == "false") return false;
    Fail(key, " expects true or false, got '", tok.size() > 1 ? tok[1] : "", "'");
  }

  int64_t Int(std::string_view key, const std::vector<std::string_view>& tok) const {
    int64_t v = -1;
    const std::string_view s = tok.size() > 1 ? tok[1] : "";
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (r.ec != std::errc() || r.ptr != s.data() + s.size() || v <= 0) {
      Fail(key, " expects a positive integer, got '", s, "'");
    }
    return v;
  }

  void ParseLine(std::string_view line) {
    if (line.empty() || line[0] == '#') return;
    if (line[0] == '@') {
      ParseHeader(line);
      return;
    }
    if (!in_data_) {
      Fail("a data line before @data (or a header line without '@'): '",
           line.substr(0, std::min<size_t>(line.size(), 40)), "'");
    }
    ParseCase(line);
  }

  void ParseHeader(std::string_view line) {
    const std::vector<std::string_view> tok = Tokens(line);
    const std::string key = Lower(tok[0]);
    if (in_data_) Fail("header line '", tok[0], "' after @data");
    if (key == "@data") {
      if (!has_labels_) {
        Fail(
            "no @classLabel line before @data: only classification sets are supported "
            "(@classLabel true LABEL...)");
      }
      in_data_ = true;
    } else if (key == "@problemname") {
      if (tok.size() > 1) f_.problem_name = std::string(tok[1]);
    } else if (key == "@timestamps") {
      if (Bool(tok[0], tok))
        Fail("@timeStamps true is not supported (series of (time,value) pairs)");
    } else if (key == "@univariate") {
      univariate_ = Bool(tok[0], tok);
    } else if (key == "@dimensions") {
      dimensions_ = Int(tok[0], tok);
    } else if (key == "@equallength") {
      equal_length_ = Bool(tok[0], tok);
    } else if (key == "@serieslength") {
      series_length_ = Int(tok[0], tok);
    } else if (key == "@targetlabel") {
      if (Bool(tok[0], tok)) Fail("@targetLabel true (regression) is not supported");
    } else if (key == "@classlabel") {
      if (!Bool(tok[0], tok)) {
        Fail(
            "@classLabel false: only classification sets are supported (@classLabel true "
            "LABEL...)");
      }
      if (tok.size() < 3) Fail("@classLabel true lists no labels");
      f_.class_labels.clear();
      for (size_t i = 2; i < tok.size(); ++i) f_.class_labels.emplace_back(tok[i]);
      has_labels_ = true;
    }
    // @missing and unknown keys: nothing to check (a `?` is accepted either way).
  }

  void ParseCase(std::string_view line) {
    std::vector<std::string_view> fields = Split(line, ':');
    const std::string_view label = Trim(fields.back());
    fields.pop_back();
    const int64_t channels = static_cast<int64_t>(fields.size());
    if (channels == 0) Fail("a case needs CHANNEL[:CHANNEL...]:LABEL, found no ':'");
    const int64_t expected = dimensions_ > 0 ? dimensions_ : univariate_ ? 1 : f_.channels;
    if (expected > 0 && channels != expected) {
      Fail(channels, " channels, expected ", expected,
           dimensions_ > 0 ? " (@dimensions)"
           : univariate_   ? " (@univariate true)"
                           : " (as the first case)");
    }
    f_.channels = channels;

    const auto label_it = std::find(f_.class_labels.begin(), f_.class_labels.end(), label);
    if (label_it == f_.class_labels.end()) {
      std::string known;
      for (const std::string& l : f_.class_labels) known += (known.empty() ? "" : ", ") + l;
      Fail("unknown class label '", label, "' (@classLabel lists: ", known, ")");
    }

    std::vector<float> values;
    int64_t length = -1;
    for (int64_t c = 0; c < channels; ++c) {
      const std::vector<std::string_view> items = Split(fields[c], ',');
      const int64_t n = static_cast<int64_t>(items.size());
      if (length >= 0 && n != length) {
        Fail("channel ", c + 1, " has ", n, " values but channel 1 has ", length,
             " (the channels of a case must have one length)");
      }
      length = n;
      for (int64_t i = 0; i < n; ++i) values.push_back(ParseValue(items[i], c, i));
    }
    if (equal_length_ && !f_.lengths.empty() && length != f_.lengths.front()) {
      Fail("series of length ", length, " but the first case's is ", f_.lengths.front(),
           " and @equalLength is true");
    }
    if (equal_length_ && series_length_ > 0 && length != series_length_) {
      Fail("series of length ", length, " but @seriesLength is ", series_length_);
    }
    for (int64_t c = 0; c < channels; ++c) FillMissing(values.data() + c * length, length);
    f_.cases.push_back(std::move(values));
    f_.lengths.push_back(length);
    f_.labels.push_back(label_it - f_.class_labels.begin());
  }

  float ParseValue(std::string_view raw, int64_t channel, int64_t index) {
    const std::string_view s = Trim(raw);
    if (s == "?" || Lower(s) == "nan") {
      ++f_.missing_values;
      return std::numeric_limits<float>::quiet_NaN();
    }
    std::string_view digits = s;
    if (!digits.empty() && digits[0] == '+') digits.remove_prefix(1);
    float v = 0;
    const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    // from_chars gives result_out_of_range for 1e99 (too big for float).
    if (s.empty() || r.ptr != digits.data() + digits.size() ||
        (r.ec != std::errc() && r.ec != std::errc::result_out_of_range)) {
      Fail("bad number '", s.substr(0, std::min<size_t>(s.size(), 40)), "' (channel ", channel + 1,
           ", value ", index + 1, ")");
    }
    if (r.ec == std::errc::result_out_of_range || !std::isfinite(v)) {
      Fail("value '", s, "' is not a finite float (channel ", channel + 1, ", value ", index + 1,
           ")");
    }
    return v;
  }

  std::string_view text_;
  TsFile f_;
  int64_t line_ = 0;
  bool in_data_ = false;
  bool has_labels_ = false;
  bool univariate_ = false;
  bool equal_length_ = false;
  int64_t dimensions_ = 0;
  int64_t series_length_ = 0;
};

}  // namespace

int64_t TsFile::max_length() const {
  return lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
}

int64_t TsFile::min_length() const {
  return lengths.empty() ? 0 : *std::min_element(lengths.begin(), lengths.end());
}

TsFile ParseTs(std::string_view text, const std::string& path) {
  return TsParser(text, path).Parse();
}

TsFile ReadTsFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw Error(
        StrCat("cannot open .ts file '", path, "': ", ec ? ec.message() : "not a regular file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(StrCat("cannot open .ts file '", path, "'"));
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) throw Error(StrCat("cannot read .ts file '", path, "'"));
  return ParseTs(os.str(), path);
}

}  // namespace cnnflow
