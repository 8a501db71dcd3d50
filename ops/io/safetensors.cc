#include "ops/io/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <set>

#include "ops/error.h"
#include "ops/io/file_write.h"
#include "ops/io/json.h"

namespace cnnflow {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swaps here");

namespace {

// ------------------------------------------------------------------ helpers

std::string Prefix(const std::string& path) { return StrCat("safetensors '", path, "': "); }

bool ParseDType(const std::string& name, DType* out) {
  for (DType t : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI64}) {
    if (name == SafetensorsName(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

// A non-negative integer that fits int64, or false.
bool JsonToIndex(const Json& v, int64_t* out) {
  if (!v.is_number() || v.number_text().empty()) return false;
  uint64_t x = 0;
  for (const char c : v.number_text()) {
    if (c < '0' || c > '9') return false;  // negative, fraction or exponent
    if (x > (static_cast<uint64_t>(INT64_MAX) - (c - '0')) / 10) return false;
    x = x * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = static_cast<int64_t>(x);
  return true;
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
    throw Error(StrCat("cannot write '", tmp, "': ", ErrnoText(errno)));
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

// ------------------------------------------------------------------ CRC-32

// zlib's crc32 (the same CRC-32: reflected 0xEDB88320, ~0 in and out), in
// chunks that fit its uInt length. It replaced a slicing-by-8 table of our
// own: the same values, as fast or faster in every run (1.06x-2.4x on 64 MB,
// bench/results/2026-12-01-io-libraries.txt).
uint32_t Crc32(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {
    const size_t chunk = std::min<size_t>(n, 1u << 30);
    c = crc32(c, p, static_cast<uInt>(chunk));
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(c);
}

SafetensorsWritten FileSizeAndCrc32(const std::string& path) {
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) throw Error(StrCat("cannot open '", path, "': ", ErrnoText(errno)));
  SafetensorsWritten out;
  std::vector<unsigned char> buf(1 << 20);
  size_t got;
  while ((got = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) {
    out.crc32 = Crc32(buf.data(), got, out.crc32);
    out.bytes += got;
  }
  if (std::ferror(f.get())) throw Error(StrCat("cannot read '", path, "': ", ErrnoText(errno)));
  return out;
}

// ------------------------------------------------------------------ save

void SaveSafetensors(const std::string& path,
                     const std::vector<std::pair<std::string, Tensor>>& tensors,
                     const std::map<std::string, std::string>& metadata,
                     SafetensorsWritten* written) {
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
      AppendJsonString(header, k);
      header += ':';
      AppendJsonString(header, v);
    }
    header += '}';
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (header.size() > 1) header += ',';
    AppendJsonString(header, tensors[i].first);
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
    if (!f) throw Error(StrCat("cannot create '", tmp, "': ", ErrnoText(errno)));
    const uint64_t n = header.size();  // little-endian on this host (asserted above)
    SafetensorsWritten info;
    auto put = [&](const void* data, size_t bytes) {
      WriteAll(f.get(), data, bytes, tmp);
      if (written) info.crc32 = Crc32(data, bytes, info.crc32);
      info.bytes += bytes;
    };
    put(&n, sizeof n);
    put(header.data(), header.size());
    for (const Tensor& t : host) put(t.raw_data(), t.nbytes());
    if (written) *written = info;
    if (std::fflush(f.get()) != 0 || ::fsync(::fileno(f.get())) != 0) {
      throw Error(StrCat("cannot flush '", tmp, "': ", ErrnoText(errno)));
    }
    if (std::fclose(f.release()) != 0) {
      throw Error(StrCat("cannot close '", tmp, "': ", ErrnoText(errno)));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      throw Error(StrCat("cannot rename '", tmp, "' to '", path, "': ", ErrnoText(errno)));
    }
  } catch (const Error& e) {
    std::remove(tmp.c_str());
    throw Error(StrCat(Prefix(path), e.what()));
  }
  try {
    FsyncDir(DirName(path));  // makes the rename itself durable
  } catch (const Error& e) {
    throw Error(StrCat(Prefix(path), e.what()));
  }
}

// ------------------------------------------------------------------ load

const Tensor* SafetensorsFile::Find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

namespace {

// One tensor's header entry: bytes [begin, end) of the data section.
struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int64_t begin, end;
};

// The 8-byte length and the JSON header after it, checked against the file
// size; *data_size gets the bytes that follow the header.
std::string ReadHeader(std::FILE* f, const std::string& pre, uint64_t* data_size) {
  struct stat st;
  if (::fstat(::fileno(f), &st) != 0) throw Error(StrCat(pre, "cannot stat: ", ErrnoText(errno)));
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    throw Error(StrCat(pre, "file is ", file_size,
                       " bytes, too short for the 8-byte header length (truncated?)"));
  }
  uint64_t header_len = 0;
  if (std::fread(&header_len, 1, 8, f) != 8) {
    throw Error(StrCat(pre, "cannot read the header length: ", ErrnoText(errno)));
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
  if (std::fread(header.data(), 1, header_len, f) != header_len) {
    throw Error(StrCat(pre, "cannot read the ", header_len, "-byte header"));
  }
  *data_size = file_size - 8 - header_len;
  return header;
}

// "__metadata__": string values only.
void ReadMetadata(const Json& info, const std::string& pre,
                  std::map<std::string, std::string>* out) {
  if (info.kind() != Json::Kind::kObject) {
    throw Error(StrCat(pre, "__metadata__ is ", JsonKindName(info.kind()), ", expected an object"));
  }
  for (const auto& [k, v] : info.members()) {
    if (v.kind() != Json::Kind::kString) {
      throw Error(StrCat(pre, "__metadata__ value of \"", k, "\" is ", JsonKindName(v.kind()),
                         ", expected a string"));
    }
    (*out)[k] = v.AsString();
  }
}

// An entry's "dtype": one cnnflow holds, or an error naming it.
DType EntryDType(const Json& dtype, const std::string& what) {
  if (dtype.kind() != Json::Kind::kString) throw Error(StrCat(what, "dtype is not a string"));
  DType t;
  if (ParseDType(dtype.AsString(), &t)) return t;
  static const std::set<std::string> kOther = {"BOOL",    "U8",      "I8",  "I16", "U16",
                                               "I32",     "U32",     "I64", "U64", "F8_E4M3",
                                               "F8_E5M2", "F8_E8M0", "C64"};
  if (kOther.count(dtype.AsString())) {
    throw Error(StrCat(what, "dtype ", dtype.AsString(),
                       " is not supported by cnnflow (supported: F32, F64, F16, BF16)"));
  }
  throw Error(StrCat(what, "unknown dtype \"", dtype.AsString(), "\""));
}

// A tensor's entry {"dtype", "shape", "data_offsets"}: its offsets within
// the data_size bytes of data, and as many bytes as its shape and dtype need.
Entry ParseEntry(const std::string& name, const Json& info, uint64_t data_size,
                 const std::string& pre) {
  const std::string what = StrCat(pre, "tensor '", name, "': ");
  if (info.kind() != Json::Kind::kObject) {
    throw Error(StrCat(what, "entry is ", JsonKindName(info.kind()), ", expected an object"));
  }
  Entry e;
  e.name = name;
  const Json* dtype = info.Find("dtype");
  const Json* shape = info.Find("shape");
  const Json* offsets = info.Find("data_offsets");
  if (!dtype || !shape || !offsets) {
    throw Error(StrCat(what, "needs \"dtype\", \"shape\" and \"data_offsets\""));
  }
  e.dtype = EntryDType(*dtype, what);
  if (shape->kind() != Json::Kind::kArray) throw Error(StrCat(what, "shape is not an array"));
  int64_t numel = 1;
  bool overflow = false;
  for (const Json& d : shape->items()) {
    int64_t x;
    if (!JsonToIndex(d, &x)) {
      throw Error(StrCat(what, "shape has an entry that is not a non-negative integer"));
    }
    e.shape.push_back(x);
    overflow |= __builtin_mul_overflow(numel, x, &numel);
  }
  if (offsets->kind() != Json::Kind::kArray || offsets->items().size() != 2 ||
      !JsonToIndex(offsets->items()[0], &e.begin) || !JsonToIndex(offsets->items()[1], &e.end)) {
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
    throw Error(StrCat(what, "shape ", Shape(e.shape), " of ", dtype->AsString(), " needs ",
                       overflow ? std::string("too many") : StrCat(bytes),
                       " bytes but data_offsets [", e.begin, ", ", e.end, "] hold ",
                       e.end - e.begin));
  }
  return e;
}

// Sorts the entries by offset; two that share bytes are an error.
void SortDisjoint(std::vector<Entry>& entries, const std::string& pre) {
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
}

}  // namespace

SafetensorsFile LoadSafetensors(const std::string& path) {
  const std::string pre = Prefix(path);
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) throw Error(StrCat(pre, "cannot open: ", ErrnoText(errno)));
  uint64_t data_size = 0;
  const std::string header = ReadHeader(f.get(), pre, &data_size);
  Json root;
  try {
    root = ParseJson(header);
  } catch (const JsonError& e) {
    throw Error(StrCat(pre, "bad JSON header: ", e.what()));
  }
  if (root.kind() != Json::Kind::kObject) {
    throw Error(StrCat(pre, "the header is ", JsonKindName(root.kind()), ", expected an object"));
  }
  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& [name, info] : root.members()) {
    if (name == "__metadata__") {
      ReadMetadata(info, pre, &out.metadata);
    } else {
      entries.push_back(ParseEntry(name, info, data_size, pre));
    }
  }
  SortDisjoint(entries, pre);
  const int64_t data_start = 8 + static_cast<int64_t>(header.size());
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
