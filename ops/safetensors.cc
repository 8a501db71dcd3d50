#include "ops/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>

#include "ops/error.h"

namespace cnnflow {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swaps here");

namespace {

// ------------------------------------------------------------------ JSON
// Just enough JSON for safetensors headers: objects keep their key order,
// numbers keep their text (offsets need all 64 bits, not a double).

struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  std::string text;  // a string's value or a number's literal
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;
};

const char* KindName(Json::Kind k) {
  switch (k) {
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

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}

  // The whole text must be one value (surrounding whitespace allowed).
  Json ParseDocument() {
    Json v = ParseValue(0);
    SkipSpace();
    if (pos_ != s_.size()) Fail("unexpected text after the JSON value");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 64;

  [[noreturn]] void Fail(const std::string& what) const {
    throw Error(StrCat("bad JSON header at byte ", pos_, ": ", what));
  }

  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }

  bool Consume(const char* word) {
    const size_t n = std::strlen(word);
    if (s_.compare(pos_, n, word) != 0) return false;
    pos_ += n;
    return true;
  }

  Json ParseValue(int depth) {
    if (depth > kMaxDepth) Fail("nested too deeply");
    SkipSpace();
    if (pos_ >= s_.size()) Fail("unexpected end of text");
    Json v;
    const char c = s_[pos_];
    if (c == '{') {
      v.kind = Json::Kind::kObject;
      ++pos_;
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return v;
      }
      std::set<std::string> keys;
      while (true) {
        SkipSpace();
        if (pos_ >= s_.size() || s_[pos_] != '"') Fail("expected a string key");
        std::string key = ParseString();
        if (!keys.insert(key).second) Fail(StrCat("duplicate key \"", key, "\""));
        SkipSpace();
        if (pos_ >= s_.size() || s_[pos_] != ':') Fail("expected ':'");
        ++pos_;
        v.members.emplace_back(std::move(key), ParseValue(depth + 1));
        SkipSpace();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == '}') {
          ++pos_;
          return v;
        }
        Fail("expected ',' or '}' in an object");
      }
    }
    if (c == '[') {
      v.kind = Json::Kind::kArray;
      ++pos_;
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return v;
      }
      while (true) {
        v.items.push_back(ParseValue(depth + 1));
        SkipSpace();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == ']') {
          ++pos_;
          return v;
        }
        Fail("expected ',' or ']' in an array");
      }
    }
    if (c == '"') {
      v.kind = Json::Kind::kString;
      v.text = ParseString();
      return v;
    }
    if (Consume("true")) {
      v.kind = Json::Kind::kBool;
      v.boolean = true;
      return v;
    }
    if (Consume("false")) {
      v.kind = Json::Kind::kBool;
      return v;
    }
    if (Consume("null")) return v;
    if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Json::Kind::kNumber;
      v.text = ParseNumber();
      return v;
    }
    Fail(StrCat("unexpected character '", c, "'"));
  }

  bool IsDigit() const { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; }

  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  std::string ParseNumber() {
    const size_t start = pos_;
    if (s_[pos_] == '-') ++pos_;
    if (!IsDigit()) Fail("expected a digit");
    if (s_[pos_] == '0') {
      ++pos_;
    } else {
      while (IsDigit()) ++pos_;
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!IsDigit()) Fail("expected a digit after '.'");
      while (IsDigit()) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!IsDigit()) Fail("expected a digit in the exponent");
      while (IsDigit()) ++pos_;
    }
    return s_.substr(start, pos_ - start);
  }

  unsigned Hex4() {
    if (pos_ + 4 > s_.size()) Fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') {
        v |= h - '0';
      } else if (h >= 'a' && h <= 'f') {
        v |= h - 'a' + 10;
      } else if (h >= 'A' && h <= 'F') {
        v |= h - 'A' + 10;
      } else {
        Fail("bad hex digit in \\u escape");
      }
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
    ++pos_;
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) Fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[pos_++]);
      if (c == '"') return out;
      if (c < 0x20) Fail("control character in a string");
      if (c != '\\') {
        out += static_cast<char>(c);
        continue;
      }
      if (pos_ >= s_.size()) Fail("unterminated escape");
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
          unsigned cp = Hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (!Consume("\\u")) Fail("high surrogate without a low one");
            const unsigned lo = Hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) Fail("bad low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            Fail("low surrogate without a high one");
          }
          AppendUtf8(out, cp);
          break;
        }
        default:
          Fail(StrCat("bad escape '\\", e, "'"));
      }
    }
  }

  const std::string& s_;
  size_t pos_ = 0;
};

void WriteJsonString(std::string& out, const std::string& s) {
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
        if (c < 0x20) {
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

// ------------------------------------------------------------------ helpers

std::string Prefix(const std::string& path) { return StrCat("safetensors '", path, "': "); }

std::string ErrnoText() { return std::strerror(errno); }

bool ParseDType(const std::string& name, DType* out) {
  for (DType t : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
    if (name == SafetensorsName(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

// A non-negative integer that fits int64, or false.
bool JsonToIndex(const Json& v, int64_t* out) {
  if (v.kind != Json::Kind::kNumber || v.text.empty()) return false;
  uint64_t x = 0;
  for (const char c : v.text) {
    if (c < '0' || c > '9') return false;  // negative, fraction or exponent
    if (x > (static_cast<uint64_t>(INT64_MAX) - (c - '0')) / 10) return false;
    x = x * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = static_cast<int64_t>(x);
  return true;
}

const Json* Member(const Json& obj, const char* key) {
  for (const auto& [k, v] : obj.members)
    if (k == key) return &v;
  return nullptr;
}

// Closes a FILE* on scope exit.
struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

void WriteAll(std::FILE* f, const void* data, size_t n, const std::string& tmp) {
  if (n > 0 && std::fwrite(data, 1, n, f) != n) {
    throw Error(StrCat("cannot write '", tmp, "': ", ErrnoText()));
  }
}

std::string DirName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

constexpr uint64_t kMaxHeaderBytes = 100 << 20;  // the Python library's limit

}  // namespace

// ------------------------------------------------------------------ save

void SaveSafetensors(const std::string& path,
                     const std::vector<std::pair<std::string, Tensor>>& tensors,
                     const std::map<std::string, std::string>& metadata) {
  // Host copies first, so a bad tensor fails before anything is written.
  std::vector<Tensor> host;
  std::set<std::string> names;
  host.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__") {
      throw Error(StrCat(Prefix(path), "invalid tensor name '", name, "'"));
    }
    if (!names.insert(name).second) {
      throw Error(StrCat(Prefix(path), "tensor name '", name, "' appears twice"));
    }
    if (!t.defined()) throw Error(StrCat(Prefix(path), "tensor '", name, "' is undefined"));
    if (!t.is_contiguous()) {
      throw Error(StrCat(Prefix(path), "tensor '", name, "' ", t.shape(), " is not contiguous"));
    }
    host.push_back(t.device().is_cpu() ? t : t.To(Device::Cpu()));
  }

  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) header += ',';
      first = false;
      WriteJsonString(header, k);
      header += ':';
      WriteJsonString(header, v);
    }
    header += '}';
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (header.size() > 1) header += ',';
    WriteJsonString(header, tensors[i].first);
    header += StrCat(":{\"dtype\":\"", SafetensorsName(host[i].dtype()), "\",\"shape\":[");
    for (int d = 0; d < host[i].rank(); ++d) header += StrCat(d ? "," : "", host[i].dim(d));
    const uint64_t end = offset + host[i].nbytes();
    header += StrCat("],\"data_offsets\":[", offset, ",", end, "]}");
    offset = end;
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');

  const std::string tmp = StrCat(path, ".tmp.", ::getpid());
  try {
    FilePtr f(std::fopen(tmp.c_str(), "wb"));
    if (!f) throw Error(StrCat("cannot create '", tmp, "': ", ErrnoText()));
    const uint64_t n = header.size();  // little-endian on this host (asserted above)
    WriteAll(f.get(), &n, sizeof n, tmp);
    WriteAll(f.get(), header.data(), header.size(), tmp);
    for (const Tensor& t : host) WriteAll(f.get(), t.raw_data(), t.nbytes(), tmp);
    if (std::fflush(f.get()) != 0 || ::fsync(::fileno(f.get())) != 0) {
      throw Error(StrCat("cannot flush '", tmp, "': ", ErrnoText()));
    }
    if (std::fclose(f.release()) != 0) {
      throw Error(StrCat("cannot close '", tmp, "': ", ErrnoText()));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      throw Error(StrCat("cannot rename '", tmp, "' to '", path, "': ", ErrnoText()));
    }
  } catch (const Error& e) {
    std::remove(tmp.c_str());
    throw Error(StrCat(Prefix(path), e.what()));
  }
  // Make the rename itself durable. Some file systems cannot fsync a
  // directory (EINVAL); the data is safe on those anyway.
  const std::string dir = DirName(path);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0 && err != EINVAL && err != EROFS) {
      throw Error(StrCat(Prefix(path), "cannot fsync directory '", dir, "': ", std::strerror(err)));
    }
  }
}

// ------------------------------------------------------------------ load

const Tensor* SafetensorsFile::Find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

SafetensorsFile LoadSafetensors(const std::string& path) {
  const std::string pre = Prefix(path);
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) throw Error(StrCat(pre, "cannot open: ", ErrnoText()));
  struct stat st;
  if (::fstat(::fileno(f.get()), &st) != 0) throw Error(StrCat(pre, "cannot stat: ", ErrnoText()));
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    throw Error(StrCat(pre, "file is ", file_size,
                       " bytes, too short for the 8-byte header length (truncated?)"));
  }
  uint64_t header_len = 0;
  if (std::fread(&header_len, 1, 8, f.get()) != 8) {
    throw Error(StrCat(pre, "cannot read the header length: ", ErrnoText()));
  }
  if (header_len > file_size - 8) {
    throw Error(StrCat(pre, "header length ", header_len, " exceeds the ", file_size - 8,
                       " bytes after the length prefix (truncated or not a safetensors file)"));
  }
  if (header_len > kMaxHeaderBytes) {
    throw Error(StrCat(pre, "header length ", header_len, " exceeds the limit of ", kMaxHeaderBytes,
                       " bytes"));
  }
  if (header_len < 2) throw Error(StrCat(pre, "header length ", header_len, " is too short"));
  std::string header(header_len, '\0');
  if (std::fread(header.data(), 1, header_len, f.get()) != header_len) {
    throw Error(StrCat(pre, "cannot read the ", header_len, "-byte header"));
  }
  const uint64_t data_size = file_size - 8 - header_len;

  Json root;
  try {
    root = JsonParser(header).ParseDocument();
  } catch (const Error& e) {
    throw Error(StrCat(pre, e.what()));
  }
  if (root.kind != Json::Kind::kObject) {
    throw Error(StrCat(pre, "the header is ", KindName(root.kind), ", expected an object"));
  }

  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    int64_t begin, end;
  };
  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& [name, info] : root.members) {
    if (name == "__metadata__") {
      if (info.kind != Json::Kind::kObject) {
        throw Error(StrCat(pre, "__metadata__ is ", KindName(info.kind), ", expected an object"));
      }
      for (const auto& [k, v] : info.members) {
        if (v.kind != Json::Kind::kString) {
          throw Error(StrCat(pre, "__metadata__ value of \"", k, "\" is ", KindName(v.kind),
                             ", expected a string"));
        }
        out.metadata[k] = v.text;
      }
      continue;
    }
    const std::string what = StrCat(pre, "tensor '", name, "': ");
    if (info.kind != Json::Kind::kObject) {
      throw Error(StrCat(what, "entry is ", KindName(info.kind), ", expected an object"));
    }
    Entry e;
    e.name = name;
    const Json* dtype = Member(info, "dtype");
    const Json* shape = Member(info, "shape");
    const Json* offsets = Member(info, "data_offsets");
    if (!dtype || !shape || !offsets) {
      throw Error(StrCat(what, "needs \"dtype\", \"shape\" and \"data_offsets\""));
    }
    if (dtype->kind != Json::Kind::kString) throw Error(StrCat(what, "dtype is not a string"));
    if (!ParseDType(dtype->text, &e.dtype)) {
      static const std::set<std::string> kOther = {"BOOL",    "U8",      "I8",  "I16", "U16",
                                                   "I32",     "U32",     "I64", "U64", "F8_E4M3",
                                                   "F8_E5M2", "F8_E8M0", "C64"};
      if (kOther.count(dtype->text)) {
        throw Error(StrCat(what, "dtype ", dtype->text,
                           " is not supported by cnnflow (supported: F32, F64, F16, BF16)"));
      }
      throw Error(StrCat(what, "unknown dtype \"", dtype->text, "\""));
    }
    if (shape->kind != Json::Kind::kArray) throw Error(StrCat(what, "shape is not an array"));
    int64_t numel = 1;
    bool overflow = false;
    for (const Json& d : shape->items) {
      int64_t x;
      if (!JsonToIndex(d, &x)) {
        throw Error(StrCat(what, "shape has an entry that is not a non-negative integer"));
      }
      e.shape.push_back(x);
      overflow |= __builtin_mul_overflow(numel, x, &numel);
    }
    if (offsets->kind != Json::Kind::kArray || offsets->items.size() != 2 ||
        !JsonToIndex(offsets->items[0], &e.begin) || !JsonToIndex(offsets->items[1], &e.end)) {
      throw Error(StrCat(what, "data_offsets must be two non-negative integers [begin, end]"));
    }
    if (e.end < e.begin) {
      throw Error(StrCat(what, "data_offsets [", e.begin, ", ", e.end, "] end before they begin"));
    }
    if (static_cast<uint64_t>(e.end) > data_size) {
      throw Error(StrCat(what, "data_offsets [", e.begin, ", ", e.end,
                         "] out of range: the data section has ", data_size,
                         " bytes (truncated file?)"));
    }
    int64_t bytes = 0;
    overflow |= __builtin_mul_overflow(numel, static_cast<int64_t>(DTypeSize(e.dtype)), &bytes);
    if (overflow || bytes != e.end - e.begin) {
      throw Error(StrCat(what, "shape ", Shape(e.shape), " of ", dtype->text, " needs ",
                         overflow ? std::string("too many") : StrCat(bytes),
                         " bytes but data_offsets [", e.begin, ", ", e.end, "] hold ",
                         e.end - e.begin));
    }
    entries.push_back(std::move(e));
  }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < entries.size(); ++i) {
    const Entry& a = entries[i - 1];
    const Entry& b = entries[i];
    if (b.begin < a.end) {
      throw Error(StrCat(pre, "tensors '", a.name, "' [", a.begin, ", ", a.end, ") and '", b.name,
                         "' [", b.begin, ", ", b.end, ") overlap"));
    }
  }
  const int64_t data_start = 8 + static_cast<int64_t>(header_len);
  for (const Entry& e : entries) {
    Tensor t = Tensor::Empty(Shape(e.shape), e.dtype);
    const size_t n = t.nbytes();
    if (n > 0) {
      if (::fseeko(f.get(), data_start + e.begin, SEEK_SET) != 0 ||
          std::fread(t.raw_data(), 1, n, f.get()) != n) {
        throw Error(StrCat(pre, "cannot read the ", n, " bytes of tensor '", e.name, "'"));
      }
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace cnnflow
