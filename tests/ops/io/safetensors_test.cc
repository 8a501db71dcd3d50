#include "ops/io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/testing/helpers.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

using testing::ReadBytes;
using testing::TestDir;
using testing::WriteBytes;

std::string Le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

template <typename T>
std::string RawBytes(std::initializer_list<T> values) {
  std::string s;
  for (T v : values) s.append(reinterpret_cast<const char*>(&v), sizeof v);
  return s;
}

// A file made of a header (padded to 8) and data.
std::string Assemble(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return Le64(header.size()) + header + data;
}

// The message of the Error that LoadSafetensors throws ("" if none).
std::string LoadError(const std::string& path) {
  return testing::ErrorOf([&] { LoadSafetensors(path); });
}

Tensor Iota(const Shape& shape, DType dtype, double start = 0) {
  Tensor t = Tensor::Empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) t.Set(i, start + 0.5 * static_cast<double>(i));
  return t;
}

TEST(Safetensors, RoundTripKeepsNamesShapesValuesAndMetadata) {
  const std::string path = TestDir() + "/model.safetensors";
  Tensor half = Tensor::Empty({3}, DType::kF16);
  const uint16_t half_bits[3] = {0x3c00, 0xc000, 0x7bff};  // 1, -2, 65504
  std::memcpy(half.raw_data(), half_bits, sizeof half_bits);
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"conv1.weight", Iota({2, 1, 3, 3}, DType::kF32, -4)},
      {"fc.bias", Iota({5}, DType::kF64, 1)},
      {"scalar", Tensor::Full({}, 7.0)},
      {"empty", Tensor::Zeros({0, 3})},
      {"half", half},
      {"name with \"quotes\" and \\ and \xc3\xa9", Iota({2}, DType::kF32)},
  };
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"epoch", "3"}, {"odd", "line\nbreak\ttab \"q\" \x01 end"}};
  SaveSafetensors(path, tensors, meta);

  const SafetensorsFile f = LoadSafetensors(path);
  EXPECT_EQ(f.metadata, meta);
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, want] = tensors[i];
    SCOPED_TRACE(name);
    EXPECT_EQ(f.tensors[i].first, name);  // written (and read) in the given order
    const Tensor* got = f.Find(name);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(got->shape(), want.shape());
    EXPECT_EQ(got->dtype(), want.dtype());
    EXPECT_EQ(std::memcmp(got->raw_data(), want.raw_data(), want.nbytes()), 0);
  }
  EXPECT_EQ(f.Find("missing"), nullptr);
  EXPECT_DOUBLE_EQ(f.Find("fc.bias")->At(4), 3.0);
}

TEST(Safetensors, HeaderBytesAreExactlyTheFormat) {
  const std::string path = TestDir() + "/exact.safetensors";
  Tensor a = Tensor::Empty({2}, DType::kF32);
  a.Set(0, 1.0);
  a.Set(1, 2.0);
  Tensor b = Tensor::Full({1}, 3.0, DType::kF64);
  SaveSafetensors(path, {{"a", a}, {"b", b}}, {{"format", "pt"}});

  const std::string json = R"({"__metadata__":{"format":"pt"},)"
                           R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F64","shape":[1],"data_offsets":[8,16]}})";
  const std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  const std::string want =
      Le64(padded.size()) + padded + RawBytes<float>({1.0f, 2.0f}) + RawBytes<double>({3.0});
  const std::string got = ReadBytes(path);
  EXPECT_EQ(got.size() % 8, 0u);
  EXPECT_EQ(got.substr(0, 8), Le64(padded.size()));
  EXPECT_EQ(got.substr(8, padded.size()), padded);
  EXPECT_EQ(got, want);
}

TEST(Safetensors, NoMetadataMeansNoMetadataKey) {
  const std::string path = TestDir() + "/plain.safetensors";
  SaveSafetensors(path, {{"x", Tensor::Zeros({1})}});
  const std::string got = ReadBytes(path);
  EXPECT_EQ(got.substr(8, 56), R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}  )");
}

TEST(Safetensors, ReadsAFileFromAnIndependentWriter) {
  // Hand-assembled: whitespace, keys in another order, escapes, metadata
  // last, and the tensors listed in the reverse of their data order.
  const std::string path = TestDir() + "/foreign.safetensors";
  const std::string header =
      "{\n  \"w\\u00e9ight\" : {\"data_offsets\": [8, 32], \"shape\": [2, 3],"
      " \"dtype\": \"F32\"},\n  \"bias\": {\"dtype\": \"BF16\", \"shape\": [4],"
      " \"data_offsets\": [0, 8]},\n  \"__metadata__\": {\"note\": \"a\\/b\\u0041\\n\"}\n}";
  const std::string data =
      RawBytes<uint16_t>({0x3f80, 0x4000, 0xbf80, 0x0000}) + RawBytes<float>({0, 1, 2, 3, 4, 5.5f});
  WriteBytes(path, Assemble(header, data));

  const SafetensorsFile f = LoadSafetensors(path);
  EXPECT_EQ(f.metadata.at("note"), "a/bA\n");
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].first, "bias");  // data order
  const Tensor* w = f.Find("w\xc3\xa9ight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape(), Shape({2, 3}));
  EXPECT_EQ(w->At(5), 5.5);
  const Tensor* bias = f.Find("bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->dtype(), DType::kBF16);
  EXPECT_EQ(static_cast<const uint16_t*>(bias->raw_data())[1], 0x4000);
}

TEST(Safetensors, TruncatedFilesAreErrorsNamingThePath) {
  const std::string dir = TestDir();
  const std::string tiny = dir + "/tiny.safetensors";
  WriteBytes(tiny, "abc");
  std::string msg = LoadError(tiny);
  EXPECT_NE(msg.find(tiny), std::string::npos) << msg;
  EXPECT_NE(msg.find("too short"), std::string::npos) << msg;

  const std::string huge = dir + "/huge.safetensors";
  WriteBytes(huge, Le64(1000) + "{}");
  msg = LoadError(huge);
  EXPECT_NE(msg.find(huge), std::string::npos) << msg;
  EXPECT_NE(msg.find("header length 1000 exceeds"), std::string::npos) << msg;

  // A valid file cut in the data section.
  const std::string cut = dir + "/cut.safetensors";
  SaveSafetensors(cut, {{"x", Iota({4}, DType::kF32)}});
  const std::string bytes = ReadBytes(cut);
  WriteBytes(cut, bytes.substr(0, bytes.size() - 3));
  msg = LoadError(cut);
  EXPECT_NE(msg.find(cut), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor 'x'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;

  msg = LoadError(dir + "/absent.safetensors");
  EXPECT_NE(msg.find("absent.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
}

TEST(Safetensors, BadJsonIsAnError) {
  const std::string dir = TestDir();
  struct Case {
    std::string header, expect;
  };
  const Case cases[] = {
      {R"({"a": {"dtype": "F32", )", "bad JSON header"},
      {R"({"a": 1,})", "bad JSON header"},
      {R"({"a": "x\q"})", "bad escape"},
      {R"({"a": {}, "a": {}})", "duplicate key"},
      {R"([1, 2])", "expected an object"},
      {R"({"a": {"dtype": "F32", "shape": [1]}})",
       "needs \"dtype\", \"shape\" and \"data_offsets\""},
      {R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", "non-negative"},
      {R"({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", "non-negative"},
      {R"({"__metadata__": {"k": 1}})", "expected a string"},
      {R"({} trailing)", "unexpected text after"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string path = dir + "/bad" + std::to_string(i++) + ".safetensors";
    WriteBytes(path, Assemble(c.header, std::string(8, '\0')));
    const std::string msg = LoadError(path);
    EXPECT_NE(msg.find(path), std::string::npos) << c.header << " -> " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.header << " -> " << msg;
  }
}

TEST(Safetensors, BadOffsetsShapesAndDtypesAreErrors) {
  const std::string dir = TestDir();
  struct Case {
    std::string header, expect;
  };
  const Case cases[] = {
      {R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", "out of range"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", "end before"},
      {R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
       "needs 12 bytes but data_offsets [0, 8] hold 8"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
       R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
       "overlap"},
      {R"({"a": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}})",
       "dtype I32 is not supported"},
      {R"({"a": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 8]}})", "unknown dtype \"Q4\""},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 99999999999999999999]}})",
       "two non-negative integers"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string path = dir + "/bad" + std::to_string(i++) + ".safetensors";
    WriteBytes(path, Assemble(c.header, std::string(8, '\0')));
    const std::string msg = LoadError(path);
    EXPECT_NE(msg.find(path), std::string::npos) << c.header << " -> " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.header << " -> " << msg;
  }
}

TEST(Safetensors, SaveRejectsDuplicateAndReservedNames) {
  const std::string path = TestDir() + "/names.safetensors";
  EXPECT_THROW(SaveSafetensors(path, {{"a", Tensor::Zeros({1})}, {"a", Tensor::Zeros({1})}}),
               Error);
  EXPECT_THROW(SaveSafetensors(path, {{"__metadata__", Tensor::Zeros({1})}}), Error);
  EXPECT_FALSE(fs::exists(path));
}

TEST(Safetensors, WriteIsAtomicAndReplacesTheOldFileWhole) {
  const std::string dir = TestDir();
  const std::string path = dir + "/ckpt.safetensors";
  SaveSafetensors(path, {{"big", Iota({1000}, DType::kF64)}}, {{"step", "1"}});
  SaveSafetensors(path, {{"small", Iota({2}, DType::kF32, 9)}}, {{"step", "2"}});
  const SafetensorsFile f = LoadSafetensors(path);
  EXPECT_EQ(f.metadata.at("step"), "2");
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].first, "small");
  EXPECT_EQ(fs::file_size(path), ReadBytes(path).size());
  // Exactly the new file's bytes: nothing of the old, longer file remains.
  EXPECT_LT(fs::file_size(path), 1000u);
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos) << entry.path();

  // A failed write (no such directory) leaves nothing behind.
  const std::string bad = dir + "/no/such/dir/ckpt.safetensors";
  try {
    SaveSafetensors(bad, {{"x", Tensor::Zeros({1})}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
  size_t entries = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    (void)entry;
    ++entries;
  }
  EXPECT_EQ(entries, 1u);
}

// Python's own json and struct modules read our file (and torch, when
// installed, interprets the bytes as tensors).
TEST(Safetensors, PythonReadsOurFile) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  const std::string dir = TestDir();
  const std::string path = dir + "/py.safetensors";
  Tensor w = Iota({2, 3}, DType::kF32, -1);
  SaveSafetensors(path, {{"w", w}, {"b", Iota({2}, DType::kF64, 10)}}, {{"format", "pt"}});
  const std::string script = dir + "/read.py";
  std::ofstream(script) << R"PY(
import json, struct, sys
raw = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
assert (8 + n) % 8 == 0
hdr = json.loads(raw[8:8 + n].decode('utf-8'))
data = raw[8 + n:]
out = ['meta ' + hdr.pop('__metadata__')['format']]
for name, info in hdr.items():
    b, e = info['data_offsets']
    fmt = {'F32': 'f', 'F64': 'd'}[info['dtype']]
    vals = struct.unpack('<%d%s' % ((e - b) // struct.calcsize(fmt), fmt), data[b:e])
    out.append('%s %s %s %s' % (name, info['dtype'], info['shape'], ' '.join(repr(v) for v in vals)))
try:
    import torch
    t = torch.frombuffer(bytearray(data[hdr['w']['data_offsets'][0]:hdr['w']['data_offsets'][1]]),
                         dtype=torch.float32).reshape(hdr['w']['shape'])
    out.append('torch %r' % t[1, 2].item())
except ImportError:
    out.append('torch absent')
print('\n'.join(out))
)PY";
  FILE* p = ::popen(("/usr/bin/python3 " + script + " " + path + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string output;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) output += buf;
  const int rc = ::pclose(p);
  ASSERT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("meta pt\n"), std::string::npos) << output;
  EXPECT_NE(output.find("w F32 [2, 3] -1.0 -0.5 0.0 0.5 1.0 1.5\n"), std::string::npos) << output;
  EXPECT_NE(output.find("b F64 [2] 10.0 10.5\n"), std::string::npos) << output;
  if (output.find("torch absent") == std::string::npos) {
    EXPECT_NE(output.find("torch 1.5"), std::string::npos) << output;
  }
}

}  // namespace
}  // namespace cnnflow
