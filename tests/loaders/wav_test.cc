// The WAV reader on files whose bytes are written here: a header spelled
// out byte by byte, extra chunks (LIST with a pad byte, before and after
// fmt), stereo, WAVE_FORMAT_EXTENSIBLE, and the errors (truncated data,
// 8-bit, float, not RIFF, missing chunks) naming the file.
#include "loaders/wav.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ops/error.h"
#include "tests/testing/helpers.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

void Put16(std::string* s, uint16_t v) {
  s->push_back(static_cast<char>(v & 0xff));
  s->push_back(static_cast<char>(v >> 8));
}
void Put32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string Chunk(const std::string& id, const std::string& body) {
  std::string s = id;
  Put32(&s, static_cast<uint32_t>(body.size()));
  s += body;
  if (body.size() % 2) s.push_back('\0');  // RIFF pad byte
  return s;
}

std::string Fmt(uint16_t tag, uint16_t channels, uint32_t rate, uint16_t bits) {
  std::string f;
  Put16(&f, tag);
  Put16(&f, channels);
  Put32(&f, rate);
  Put32(&f, rate * channels * bits / 8);
  Put16(&f, static_cast<uint16_t>(channels * bits / 8));
  Put16(&f, bits);
  return Chunk("fmt ", f);
}

std::string Pcm16(const std::vector<int16_t>& v) {
  std::string d;
  for (int16_t x : v) Put16(&d, static_cast<uint16_t>(x));
  return d;
}

std::string Riff(const std::string& chunks) {
  std::string s = "RIFF";
  Put32(&s, static_cast<uint32_t>(4 + chunks.size()));
  return s + "WAVE" + chunks;
}

std::string Write(const std::string& name, const std::string& bytes) {
  const std::string path = testing::TestDir() + "/" + name;
  testing::WriteBytes(path, bytes);
  return path;
}

std::string DecodeError(const std::string& bytes) {
  WavInfo info;
  std::vector<float> s;
  return DecodeWav(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &info, &s);
}

TEST(WavTest, CanonicalHeaderByteByByte) {
  // The 44-byte header of a mono 8 kHz 16-bit file with 4 samples, as a
  // hex dump of such a file reads.
  const unsigned char header[44] = {
      'R',  'I',  'F',  'F',  0x2C, 0x00, 0x00, 0x00, 'W', 'A', 'V', 'E',  // RIFF, 36 + 8 bytes
      'f',  'm',  't',  ' ',  0x10, 0x00, 0x00, 0x00,                      // fmt, 16 bytes
      0x01, 0x00, 0x01, 0x00,                                              // PCM, 1 channel
      0x40, 0x1F, 0x00, 0x00,                                              // 8000 Hz
      0x80, 0x3E, 0x00, 0x00,                                              // 16000 bytes/s
      0x02, 0x00, 0x10, 0x00,                                              // align 2, 16 bits
      'd',  'a',  't',  'a',  0x08, 0x00, 0x00, 0x00};                     // data, 8 bytes
  std::string bytes(reinterpret_cast<const char*>(header), 44);
  const unsigned char data[8] = {0x00, 0x00, 0x00, 0x40,
                                 0x00, 0x80, 0xFF, 0x7F};  // 0, 16384, -32768, 32767
  bytes.append(reinterpret_cast<const char*>(data), 8);
  const std::string path = Write("canonical.wav", bytes);
  WavInfo info;
  const std::vector<float> s = ReadWav(path, &info);
  EXPECT_EQ(info.sample_rate, 8000);
  EXPECT_EQ(info.channels, 1);
  EXPECT_EQ(info.bits, 16);
  EXPECT_EQ(info.frames, 4);
  EXPECT_EQ(s, (std::vector<float>{0.f, 0.5f, -1.f, 32767.f / 32768.f}));
  // The test's own writer makes the same bytes.
  EXPECT_EQ(Riff(Fmt(1, 1, 8000, 16) + Chunk("data", Pcm16({0, 16384, -32768, 32767}))), bytes);
}

TEST(WavTest, UnknownChunksAreSkippedWithTheirPadByte) {
  const std::vector<int16_t> v = {100, -200, 300, -32768, 32767, 7};
  // An odd-sized LIST chunk (pad byte follows) between fmt and data, a
  // `junk` chunk before fmt and a `cue ` chunk after data.
  const std::string bytes = Riff(Chunk("junk", "xyz") + Fmt(1, 1, 16000, 16) +
                                 Chunk("LIST", std::string("INFOISFT\x05\0\0\0Lavf5", 17)) +
                                 Chunk("data", Pcm16(v)) + Chunk("cue ", "1234"));
  WavInfo info;
  const std::vector<float> s = ReadWav(Write("list.wav", bytes), &info);
  EXPECT_EQ(info.sample_rate, 16000);
  ASSERT_EQ(s.size(), v.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(s[i], v[i] / 32768.f) << i;
  // Header only: no samples decoded.
  WavInfo head;
  EXPECT_EQ(DecodeWav(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &head, nullptr),
            "");
  EXPECT_EQ(head.frames, 6);
}

TEST(WavTest, StereoIsAveragedAndExtensiblePcmIsAccepted) {
  // Frames (L, R): (1000, 3000), (-32768, -32768), (5, -6).
  const std::string stereo = Pcm16({1000, 3000, -32768, -32768, 5, -6});
  WavInfo info;
  std::vector<float> s =
      ReadWav(Write("stereo.wav", Riff(Fmt(1, 2, 8000, 16) + Chunk("data", stereo))), &info);
  EXPECT_EQ(info.channels, 2);
  EXPECT_EQ(s, (std::vector<float>{2000 / 32768.f, -1.f, -0.5f / 32768.f}));

  std::string ext;  // WAVEFORMATEXTENSIBLE: 40 bytes, sub-format PCM
  Put16(&ext, 0xFFFE);
  Put16(&ext, 1);
  Put32(&ext, 8000);
  Put32(&ext, 16000);
  Put16(&ext, 2);
  Put16(&ext, 16);
  Put16(&ext, 22);  // cbSize
  Put16(&ext, 16);  // valid bits
  Put32(&ext, 4);   // channel mask
  Put16(&ext, 1);   // sub-format GUID ...0001 (PCM)
  ext += std::string("\x00\x00\x00\x00\x10\x00\x80\x00\x00\xAA\x00\x38\x9B\x71", 14);
  s = ReadWav(Write("ext.wav", Riff(Chunk("fmt ", ext) + Chunk("data", Pcm16({-16384, 8})))));
  EXPECT_EQ(s, (std::vector<float>{-0.5f, 8 / 32768.f}));
}

// ReadWav must throw an Error naming the file and saying what is wrong.
void ExpectReadError(const std::string& name, const std::string& bytes, const std::string& what) {
  const std::string path = Write(name, bytes);
  testing::ExpectContains(testing::ErrorOf([&] { ReadWav(path); }), {path, what});
}

TEST(WavTest, BadFilesAreErrorsNamingTheFile) {
  const std::string good = Riff(Fmt(1, 1, 8000, 16) + Chunk("data", Pcm16({1, 2, 3, 4, 5})));
  ExpectReadError("truncated.wav", good.substr(0, good.size() - 3), "truncated: the data chunk");
  ExpectReadError("cut_header.wav", good.substr(0, 30), "truncated: the fmt chunk");
  ExpectReadError("8bit.wav", Riff(Fmt(1, 1, 8000, 8) + Chunk("data", "\x80\x81\x82")),
                  "8-bit PCM is not supported");
  ExpectReadError("24bit.wav", Riff(Fmt(1, 1, 8000, 24) + Chunk("data", "abcdef")), "24-bit PCM");
  ExpectReadError("float.wav", Riff(Fmt(3, 1, 8000, 32) + Chunk("data", "abcd")),
                  "format tag 3 (IEEE float)");
  ExpectReadError("mulaw.wav", Riff(Fmt(7, 1, 8000, 8) + Chunk("data", "ab")), "mu-law");
  ExpectReadError("text.wav", "hello, this is not a wave file", "not a RIFF/WAVE file");
  ExpectReadError("short.wav", "RIFF", "too short");
  ExpectReadError("nodata.wav", Riff(Fmt(1, 1, 8000, 16) + Chunk("LIST", "abcd")), "no data chunk");
  ExpectReadError("nofmt.wav", Riff(Chunk("data", Pcm16({1, 2}))), "before any fmt chunk");
  ExpectReadError("badlist.wav", Riff(Fmt(1, 1, 8000, 16) + std::string("LIST\xff\0\0\0abc", 11)),
                  "the 'LIST' chunk");
  ExpectReadError("halfframe.wav", Riff(Fmt(1, 2, 8000, 16) + Chunk("data", Pcm16({1, 2, 3}))),
                  "not a whole number of 4-byte frames");
  ExpectReadError("absent_dir/none.wav", "", "cannot open");
  // An empty data chunk is a valid, empty recording.
  EXPECT_EQ(DecodeError(Riff(Fmt(1, 1, 8000, 16) + Chunk("data", ""))), "");
}

}  // namespace
}  // namespace cnnflow
