#include "ops/io/tf_events.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

uint32_t Masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint32_t U32(const std::string& s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}

TEST(TfEvents, Crc32cKnownValues) {
  // RFC 3720 (iSCSI) B.4 and the usual check value of CRC-32C.
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  const std::string ones(32, '\xff');
  EXPECT_EQ(Crc32c(ones.data(), ones.size()), 0x62A8AB43u);
}

// Two records (the version event, one scalar event), each framed as
// TFRecord: length, masked CRC of the length, data, masked CRC of the data.
TEST(TfEvents, RecordsAreFramedAndCarryTheValues) {
  const std::string dir = testing::TestDir();
  std::string path;
  {
    TfEventWriter w(dir);
    path = w.path();
    w.Scalars(42, {{"train/loss", 0.5}});
  }
  EXPECT_EQ(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);
  const std::string bytes = testing::ReadBytes(path);
  size_t at = 0;
  std::vector<std::string> records;
  while (at < bytes.size()) {
    ASSERT_LE(at + 12, bytes.size());
    uint64_t n;
    std::memcpy(&n, bytes.data() + at, 8);
    EXPECT_EQ(U32(bytes, at + 8), Masked(Crc32c(bytes.data() + at, 8)));
    ASSERT_LE(at + 16 + n, bytes.size());
    const std::string data = bytes.substr(at + 12, n);
    EXPECT_EQ(U32(bytes, at + 12 + n), Masked(Crc32c(data.data(), data.size())));
    records.push_back(data);
    at += 16 + n;
  }
  ASSERT_EQ(records.size(), 2u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  // step 42: key 0x10, varint 42; the tag; simple_value 0.5f after key 0x15.
  EXPECT_NE(records[1].find(std::string("\x10\x2a", 2)), std::string::npos);
  EXPECT_NE(records[1].find("train/loss"), std::string::npos);
  const float half = 0.5f;
  EXPECT_NE(records[1].find("\x15" + std::string(reinterpret_cast<const char*>(&half), 4)),
            std::string::npos);
}

}  // namespace
}  // namespace cnnflow
