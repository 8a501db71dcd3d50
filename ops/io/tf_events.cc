#include "ops/io/tf_events.h"

#include <unistd.h>

#include <array>
#include <bit>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "ops/error.h"

namespace cnnflow {
namespace {

constexpr std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected 0x1EDC6F41
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = MakeCrc32cTable();

uint32_t MaskedCrc(const void* data, size_t size) {
  const uint32_t crc = Crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

// Protobuf wire format: a key is (field << 3) | wire type; 0 varint,
// 1 fixed 64 bits, 2 length-delimited, 5 fixed 32 bits; little-endian.
void PutVarint(std::string& s, uint64_t v) {
  while (v >= 0x80) {
    s.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
}
template <typename T>
void PutFixed(std::string& s, T v) {
  static_assert(std::endian::native == std::endian::little);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  s.append(b, sizeof(T));
}
void PutBytes(std::string& s, int field, const std::string& bytes) {
  PutVarint(s, (static_cast<uint64_t>(field) << 3) | 2);
  PutVarint(s, bytes.size());
  s += bytes;
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event {1: double wall_time, 2: int64 step, 3: string file_version, 5: Summary summary}.
std::string EventHead(double wall_time, int64_t step) {
  std::string e;
  PutVarint(e, (1 << 3) | 1);
  PutFixed(e, wall_time);
  if (step != 0) {
    PutVarint(e, 2 << 3);
    PutVarint(e, static_cast<uint64_t>(step));
  }
  return e;
}

// events.out.tfevents.<unix time>.<host>.<pid> in `dir`.
std::string EventFileName(const std::string& dir) {
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  return (std::filesystem::path(dir) / StrCat("events.out.tfevents.",
                                              static_cast<int64_t>(UnixSeconds()), ".", host, ".",
                                              getpid()))
      .string();
}

}  // namespace

uint32_t Crc32c(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = kCrc32cTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

TfEventWriter::TfEventWriter(const std::string& dir) : out_(EventFileName(dir), /*truncate=*/true) {
  std::string e = EventHead(UnixSeconds(), 0);
  PutBytes(e, 3, "brain.Event:2");
  WriteRecord(e);
}

void TfEventWriter::Scalars(int64_t step,
                            const std::vector<std::pair<std::string, double>>& scalars) {
  // Summary {1: repeated Value value}; Value {1: string tag, 2: float simple_value}.
  std::string summary;
  for (const auto& [tag, v] : scalars) {
    std::string value;
    PutBytes(value, 1, tag);
    PutVarint(value, (2 << 3) | 5);
    PutFixed(value, static_cast<float>(v));
    PutBytes(summary, 1, value);
  }
  std::string e = EventHead(UnixSeconds(), step);
  PutBytes(e, 5, summary);
  WriteRecord(e);
}

void TfEventWriter::WriteRecord(const std::string& data) {
  std::string r;
  PutFixed(r, static_cast<uint64_t>(data.size()));
  PutFixed(r, MaskedCrc(r.data(), 8));
  r += data;
  PutFixed(r, MaskedCrc(data.data(), data.size()));
  out_.Append(r);
}

}  // namespace cnnflow
