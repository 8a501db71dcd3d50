#include "ops/io/zip_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ops/error.h"
#include "ops/io/file_write.h"
#include "ops/io/safetensors.h"

namespace cnnflow {

namespace {

constexpr uint32_t kEndSig = 0x06054b50;       // end of central directory
constexpr uint32_t kZip64EndSig = 0x06064b50;  // ZIP64 end of central directory
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint64_t kEndSize = 22, kZip64LocatorSize = 20, kZip64EndSize = 56;
constexpr uint64_t kCentralSize = 46, kLocalSize = 30;
constexpr uint64_t kMaxComment = 0xffff;
// Deflate cannot expand data more than about 1032:1; a larger recorded
// ratio is a lie, refused before anything is inflated.
constexpr uint64_t kMaxInflateRatio = 1032;

uint16_t U16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t U32(const unsigned char* p) { return U16(p) | (static_cast<uint32_t>(U16(p + 2)) << 16); }
uint64_t U64(const unsigned char* p) { return U32(p) | (static_cast<uint64_t>(U32(p + 4)) << 32); }

// [offset, offset + n) lies within [0, limit).
bool Within(uint64_t offset, uint64_t n, uint64_t limit) {
  return offset <= limit && n <= limit - offset;
}

// Ends an inflate stream on scope exit.
struct InflateStream {
  z_stream z{};
  bool open = false;
  ~InflateStream() {
    if (open) inflateEnd(&z);
  }
};

// The ZIP64 extra field holds, in order, each size or offset whose 32-bit
// field is saturated: sets those of e from the extra fields x[0, len).
void ApplyZip64Extra(const unsigned char* x, uint64_t len, ZipEntry* e, const std::string& where) {
  for (uint64_t k = 0; k + 4 <= len;) {
    const uint16_t id = U16(x + k), field_len = U16(x + k + 2);
    if (k + 4 + field_len > len) throw Error(StrCat(where, "an extra field runs past its end"));
    if (id == 0x0001) {
      const unsigned char* p = x + k + 4;
      uint64_t left = field_len;
      for (uint64_t* field : {&e->size, &e->compressed_size, &e->local_header_offset}) {
        if (*field != 0xffffffff) continue;
        if (left < 8) throw Error(StrCat(where, "ZIP64 extra field too short"));
        *field = U64(p);
        p += 8;
        left -= 8;
      }
    }
    k += 4 + field_len;
  }
}

// The central directory header at cd[*at]; moves *at past it (its name,
// extra fields and comment). Refuses encrypted entries and methods other
// than stored and deflated.
ZipEntry ParseCentralHeader(const std::vector<unsigned char>& cd, uint64_t* at,
                            const std::string& where) {
  if (!Within(*at, kCentralSize, cd.size()) || U32(&cd[*at]) != kCentralSig) {
    throw Error(StrCat(where, "no central directory header"));
  }
  const unsigned char* h = &cd[*at];
  const uint16_t flags = U16(h + 8);
  const uint64_t name_len = U16(h + 28), extra_len = U16(h + 30), comment_len = U16(h + 32);
  if (!Within(*at + kCentralSize, name_len + extra_len + comment_len, cd.size())) {
    throw Error(StrCat(where, "its name and fields run past the central directory"));
  }
  ZipEntry e;
  e.name.assign(reinterpret_cast<const char*>(h + kCentralSize), name_len);
  e.method = U16(h + 10);
  e.crc32 = U32(h + 16);
  e.compressed_size = U32(h + 20);
  e.size = U32(h + 24);
  e.local_header_offset = U32(h + 42);
  ApplyZip64Extra(h + kCentralSize + name_len, extra_len, &e, where);
  if (flags & 0x41) throw Error(StrCat(where, "'", e.name, "' is encrypted"));
  if (e.method != 0 && e.method != 8) {
    throw Error(StrCat(where, "'", e.name, "' uses compression method ", e.method,
                       " (read: 0 stored, 8 deflated)"));
  }
  *at += kCentralSize + name_len + extra_len + comment_len;
  return e;
}

}  // namespace

ZipReader::ZipReader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw Error(StrCat(path, ": cannot open: ", ErrnoText(errno)));
  try {
    struct stat st;
    if (::fstat(fd_, &st) != 0) throw Error(StrCat(path, ": cannot stat: ", ErrnoText(errno)));
    if (!S_ISREG(st.st_mode)) throw Error(StrCat(path, ": not a regular file"));
    file_size_ = static_cast<uint64_t>(st.st_size);
    ReadCentralDirectory();
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

ZipReader::~ZipReader() {
  if (fd_ >= 0) ::close(fd_);
}

const ZipEntry* ZipReader::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

void ZipReader::ReadAt(uint64_t offset, uint64_t n, void* dst, const std::string& what) const {
  if (!Within(offset, n, file_size_)) {
    throw Error(StrCat(path_, ": ", what, " at byte ", offset, " (", n,
                       " bytes) lies past the end of the ", file_size_, "-byte file (truncated?)"));
  }
  auto* out = static_cast<unsigned char*>(dst);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1u << 30));
    const ssize_t got = ::pread(fd_, out, chunk, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      throw Error(StrCat(path_, ": cannot read ", what, " at byte ", offset, ": ",
                         got == 0 ? std::string("unexpected end of file") : ErrnoText(errno)));
    }
    out += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
}

// An end of central directory record's fields (32-bit or ZIP64), and where
// the directory must end: before the record that describes it.
struct ZipReader::EndRecord {
  uint64_t disk = 0, cd_disk = 0, on_disk = 0;  // multi-disk fields: 0, 0, count
  uint64_t count = 0, cd_size = 0, cd_offset = 0;
  uint64_t cd_limit = 0;
};

ZipReader::EndRecord ZipReader::ReadEndRecord() const {
  if (file_size_ < kEndSize) {
    throw Error(StrCat(path_, ": the file is ", file_size_,
                       " bytes, too short for a zip archive (truncated?)"));
  }
  // The end record is the last 22 bytes, or sits before a comment of up to
  // 64 KiB: the last signature whose comment ends within the file.
  const uint64_t tail_size = std::min(file_size_, kEndSize + kMaxComment);
  const uint64_t tail_start = file_size_ - tail_size;
  std::vector<unsigned char> tail(tail_size);
  ReadAt(tail_start, tail_size, tail.data(), "the end of the archive");
  uint64_t end_at = UINT64_MAX;
  for (uint64_t i = tail_size - kEndSize + 1; i-- > 0;) {
    if (U32(&tail[i]) == kEndSig && i + kEndSize + U16(&tail[i + 20]) <= tail_size) {
      end_at = i;
      break;
    }
  }
  if (end_at == UINT64_MAX) {
    throw Error(StrCat(path_,
                       ": no zip end of central directory record: not a zip archive, or "
                       "truncated"));
  }
  const unsigned char* end = &tail[end_at];
  EndRecord r;
  r.disk = U16(end + 4);
  r.cd_disk = U16(end + 6);
  r.on_disk = U16(end + 8);
  r.count = U16(end + 10);
  r.cd_size = U32(end + 12);
  r.cd_offset = U32(end + 16);
  r.cd_limit = tail_start + end_at;
  if (r.count == 0xffff || r.cd_size == 0xffffffff || r.cd_offset == 0xffffffff) {
    ReadZip64EndRecord(&r);
  }
  return r;
}

void ZipReader::ReadZip64EndRecord(EndRecord* r) const {
  if (r->cd_limit < kZip64LocatorSize) throw Error(StrCat(path_, ": ZIP64 locator missing"));
  unsigned char loc[kZip64LocatorSize];
  ReadAt(r->cd_limit - kZip64LocatorSize, kZip64LocatorSize, loc, "the ZIP64 locator");
  if (U32(loc) != kZip64LocatorSig) {
    throw Error(StrCat(path_, ": the end record says ZIP64 but there is no ZIP64 locator"));
  }
  const uint64_t z64_at = U64(loc + 8);
  if (!Within(z64_at, kZip64EndSize, r->cd_limit - kZip64LocatorSize)) {
    throw Error(StrCat(path_, ": the ZIP64 end record offset ", z64_at, " is out of range"));
  }
  unsigned char z64[kZip64EndSize];
  ReadAt(z64_at, kZip64EndSize, z64, "the ZIP64 end record");
  if (U32(z64) != kZip64EndSig) {
    throw Error(StrCat(path_, ": no ZIP64 end record at byte ", z64_at));
  }
  r->disk = U32(z64 + 16);
  r->cd_disk = U32(z64 + 20);
  r->on_disk = U64(z64 + 24);
  r->count = U64(z64 + 32);
  r->cd_size = U64(z64 + 40);
  r->cd_offset = U64(z64 + 48);
  r->cd_limit = z64_at;
}

void ZipReader::ReadCentralDirectory() {
  const EndRecord r = ReadEndRecord();
  if (r.disk != 0 || r.cd_disk != 0 || r.on_disk != r.count) {
    throw Error(StrCat(path_, ": a multi-disk (split) zip archive is not read"));
  }
  if (!Within(r.cd_offset, r.cd_size, r.cd_limit)) {
    throw Error(StrCat(path_, ": the central directory [", r.cd_offset, ", +", r.cd_size,
                       ") lies outside the archive's ", r.cd_limit, " bytes (truncated?)"));
  }
  if (r.count > r.cd_size / kCentralSize) {
    throw Error(StrCat(path_, ": ", r.count, " entries cannot fit a central directory of ",
                       r.cd_size, " bytes"));
  }
  std::vector<unsigned char> cd(r.cd_size);
  ReadAt(r.cd_offset, r.cd_size, cd.data(), "the central directory");
  entries_.reserve(r.count);
  uint64_t at = 0;
  for (uint64_t i = 0; i < r.count; ++i) {
    const std::string where =
        StrCat(path_, ": central directory entry ", i, " (byte ", r.cd_offset + at, "): ");
    ZipEntry e = ParseCentralHeader(cd, &at, where);
    if (!by_name_.emplace(e.name, entries_.size()).second) {
      throw Error(StrCat(where, "the name '", e.name, "' appears twice"));
    }
    entries_.push_back(std::move(e));
  }
}

uint64_t ZipReader::DataOffset(const ZipEntry& e) const {
  const std::string what = StrCat("the local header of '", e.name, "'");
  unsigned char h[kLocalSize];
  ReadAt(e.local_header_offset, kLocalSize, h, what);
  if (U32(h) != kLocalSig) {
    throw Error(
        StrCat(path_, ": no local header of '", e.name, "' at byte ", e.local_header_offset));
  }
  const uint64_t name_len = U16(h + 26), extra_len = U16(h + 28);
  std::string name(name_len, '\0');
  ReadAt(e.local_header_offset + kLocalSize, name_len, name.data(), what);
  if (name != e.name) {
    throw Error(StrCat(path_, ": the local header at byte ", e.local_header_offset, " names '",
                       name, "', the central directory '", e.name, "'"));
  }
  const uint64_t data = e.local_header_offset + kLocalSize + name_len + extra_len;
  if (!Within(data, e.compressed_size, file_size_)) {
    throw Error(StrCat(path_, ": '", e.name, "' (", e.compressed_size, " bytes at byte ", data,
                       ") runs past the end of the ", file_size_, "-byte file (truncated?)"));
  }
  if (e.method == 0 && e.compressed_size != e.size) {
    throw Error(StrCat(path_, ": stored entry '", e.name, "' records ", e.compressed_size,
                       " bytes stored but ", e.size, " bytes of data"));
  }
  return data;
}

void ZipReader::CheckCrc(const ZipEntry& e, const void* data) const {
  if (e.crc32 == 0) return;  // torch.serialization.set_crc32_options(False) records none
  const uint32_t crc = Crc32(data, static_cast<size_t>(e.size));
  if (crc != e.crc32) {
    throw Error(StrCat(path_, ": '", e.name, "' fails its CRC-32 check (corrupt file)"));
  }
}

std::string ZipReader::Inflate(const ZipEntry& e, uint64_t offset) const {
  const std::string pre = StrCat(path_, ": deflated entry '", e.name, "': ");
  if (e.size / kMaxInflateRatio > e.compressed_size) {
    throw Error(StrCat(pre, "records ", e.size, " bytes from ", e.compressed_size,
                       ", more than deflate can expand"));
  }
  InflateStream s;
  if (inflateInit2(&s.z, -MAX_WBITS) != Z_OK) throw Error(StrCat(pre, "zlib cannot start"));
  s.open = true;
  std::string out(static_cast<size_t>(std::min<uint64_t>(e.size, 1 << 16)), '\0');
  std::vector<unsigned char> in;
  uint64_t read = 0, produced = 0;
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    if (s.z.avail_in == 0 && read < e.compressed_size) {
      const uint64_t n = std::min<uint64_t>(e.compressed_size - read, 1 << 20);
      in.resize(n);
      ReadAt(offset + read, n, in.data(), StrCat("'", e.name, "'"));
      read += n;
      s.z.next_in = in.data();
      s.z.avail_in = static_cast<uInt>(n);
    }
    if (produced == out.size()) {
      // Grow only as the data inflates, never past the recorded size (+1
      // byte, so that more data than recorded is caught).
      const uint64_t cap = std::min<uint64_t>(e.size + 1, std::max<uint64_t>(2 * out.size(), 1));
      out.resize(static_cast<size_t>(cap));
    }
    const uint64_t room = std::min<uint64_t>(out.size() - produced, 1u << 30);
    s.z.next_out = reinterpret_cast<Bytef*>(out.data() + produced);
    s.z.avail_out = static_cast<uInt>(room);
    rc = inflate(&s.z, Z_NO_FLUSH);
    produced += room - s.z.avail_out;
    if (rc == Z_BUF_ERROR && s.z.avail_in == 0) {  // no progress: it needs input there is not
      throw Error(StrCat(pre, "its data ends early (corrupt)"));
    }
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
      throw Error(StrCat(pre, "corrupt deflate data (", s.z.msg ? s.z.msg : "zlib error", ")"));
    }
    if (produced > e.size) {
      throw Error(StrCat(pre, "inflates to more than its recorded ", e.size, " bytes"));
    }
  }
  if (produced != e.size) {
    throw Error(StrCat(pre, "inflates to ", produced, " bytes, recorded ", e.size));
  }
  out.resize(static_cast<size_t>(produced));
  return out;
}

std::string ZipReader::Read(const ZipEntry& e) const {
  const uint64_t offset = DataOffset(e);
  std::string out;
  if (e.method == 8) {
    out = Inflate(e, offset);
  } else {
    out.resize(static_cast<size_t>(e.size));
    ReadAt(offset, e.size, out.data(), StrCat("'", e.name, "'"));
  }
  CheckCrc(e, out.data());
  return out;
}

void ZipReader::ReadStored(const ZipEntry& e, void* dst) const {
  CNNFLOW_ENFORCE(e.method == 0, "ReadStored of the deflated entry '", e.name, "'");
  ReadAt(DataOffset(e), e.size, dst, StrCat("'", e.name, "'"));
  CheckCrc(e, dst);
}

}  // namespace cnnflow
