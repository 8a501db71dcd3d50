// The .pth reader (ops/io/pth.h) on files torch.save wrote
// (tests/data/make_pth_fixtures.py: each is checked against a .safetensors
// twin the safetensors package wrote from the same tensors), on pickles
// Python's pickle module wrote that torch.load(weights_only=True) refuses,
// and on archives built here byte by byte: ZIP64, deflate, and every kind of
// lie about sizes a hostile file can tell.
#include "ops/io/pth.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ops/io/safetensors.h"
#include "ops/io/weights_file.h"
#include "ops/model.h"
#include "tests/testing/helpers.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

using testing::ErrorOf;
using testing::ExpectContains;
using testing::ReadBytes;
using testing::TestDir;
using testing::WriteBytes;
using namespace std::string_literals;

const std::string kData = "tests/data/pth/";

bool SameTensor(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

// Every tensor of `twin` is in `got` under its name with its dtype, shape
// and bytes, and `got` holds no other.
void ExpectSameTensors(const SafetensorsFile& got, const SafetensorsFile& twin) {
  EXPECT_EQ(got.tensors.size(), twin.tensors.size());
  for (const auto& [name, want] : twin.tensors) {
    const Tensor* t = got.Find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(DTypeName(t->dtype()), std::string(DTypeName(want.dtype()))) << name;
    EXPECT_EQ(t->shape(), want.shape()) << name;
    EXPECT_TRUE(SameTensor(*t, want)) << name << ": other bytes";
  }
}

TEST(Pth, ReadsEveryDtypeAndViewAsItsSafetensorsTwin) {
  const SafetensorsFile twin = LoadSafetensors(kData + "dtypes.safetensors");
  for (const std::string name : {"dtypes", "deflated", "nocrc"}) {
    SCOPED_TRACE(name);
    const SafetensorsFile f = LoadPth(kData + name + ".pth");
    ExpectSameTensors(f, twin);
    EXPECT_EQ(f.metadata.at("format"), "pth");
    EXPECT_EQ(f.metadata.count("pth.wrapper"), 0u);
    // The dict's order, as torch.save wrote it.
    ASSERT_GE(f.tensors.size(), 5u);
    EXPECT_EQ(f.tensors[0].first, "f32");
    EXPECT_EQ(f.tensors[4].first, "bn.num_batches_tracked");
    EXPECT_EQ(f.Find("f16")->dtype(), DType::kF16);
    EXPECT_EQ(f.Find("bf16")->dtype(), DType::kBF16);
    EXPECT_EQ(f.Find("f64")->dtype(), DType::kF64);
    EXPECT_EQ(f.Find("bn.num_batches_tracked")->dtype(), DType::kI64);
    EXPECT_EQ(f.Find("bn.num_batches_tracked")->shape(), Shape{});
    for (const char* widened : {"i32", "i16", "i8", "u8", "bool"})
      EXPECT_EQ(f.Find(widened)->dtype(), DType::kI64) << widened;
    // Views agree with each other, whatever the twin says: offset_view is
    // big[2:4, 1:3], transposed is big.t(); shared_a and shared_b are
    // shared[:3] and shared[2:].
    const Tensor& t = *f.Find("transposed");
    const Tensor& o = *f.Find("offset_view");
    ASSERT_EQ(t.shape(), Shape({4, 5}));
    ASSERT_EQ(o.shape(), Shape({2, 2}));
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 2; ++b) EXPECT_EQ(o.At(a * 2 + b), t.At((1 + b) * 5 + 2 + a));
    EXPECT_EQ(f.Find("shared_a")->At(2), f.Find("shared_b")->At(0));
    EXPECT_EQ(f.Find("empty")->shape(), Shape({0, 3}));
  }
}

TEST(Pth, UnwrapsATrainingCheckpointsStateDictOrModel) {
  const SafetensorsFile twin = LoadSafetensors(kData + "module.safetensors");
  for (const std::string key : {"state_dict", "model"}) {
    SCOPED_TRACE(key);
    const SafetensorsFile f = LoadPth(kData + "wrapped_" + key + ".pth");
    EXPECT_EQ(f.metadata.at("pth.wrapper"), key);
    ExpectSameTensors(f, twin);
  }
}

TEST(Pth, ADataParallelDictLoadsWithModulePrefixDropped) {
  const SafetensorsFile f = LoadPth(kData + "ddp.pth");
  const SafetensorsFile twin = LoadSafetensors(kData + "module.safetensors");
  ASSERT_EQ(f.tensors.size(), twin.tensors.size());
  for (const auto& [name, t] : f.tensors) EXPECT_EQ(name.rfind("module.", 0), 0u) << name;
  // The model's tensors: the twin's names, without num_batches_tracked.
  std::vector<std::pair<std::string, Tensor>> model;
  for (const auto& [name, t] : twin.tensors)
    if (name.find("num_batches_tracked") == std::string::npos) model.emplace_back(name, t);
  const StateDictMatch m = MatchStateDict(f.tensors, model);
  EXPECT_TRUE(m.mismatches.empty()) << ListMismatches(m);
  ASSERT_EQ(m.tensors.size(), model.size());
  for (const auto& [name, t] : m.tensors) EXPECT_TRUE(SameTensor(t, *twin.Find(name))) << name;
}

TEST(Pth, LoadWeightsFileTellsTheFormatsApartByContent) {
  const SafetensorsFile st = LoadWeightsFile("tests/data/pytorch_tiny.safetensors");
  const SafetensorsFile pth = LoadWeightsFile(kData + "pytorch_tiny.pth");
  EXPECT_EQ(st.metadata.count("format"), 0u);  // the safetensors package wrote none
  EXPECT_EQ(pth.metadata.at("format"), "pth");
  ExpectSameTensors(pth, st);
  // A .pth named otherwise is still read as one; a safetensors named .pth too.
  const std::string dir = TestDir();
  WriteBytes(dir + "/weights.bin", ReadBytes(kData + "dtypes.pth"));
  WriteBytes(dir + "/weights.pth", ReadBytes("tests/data/pytorch_tiny.safetensors"));
  EXPECT_EQ(LoadWeightsFile(dir + "/weights.bin").metadata.at("format"), "pth");
  ExpectSameTensors(LoadWeightsFile(dir + "/weights.pth"), st);
}

TEST(Pth, RefusesTheLegacyFormatSayingHowToResave) {
  for (auto load : {LoadPth, LoadWeightsFile}) {
    ExpectContains(ErrorOf([&] { load(kData + "legacy.pth"); }),
                   {kData + "legacy.pth", "legacy format", "torch < 1.6",
                    "_use_new_zipfile_serialization=False", "re-save it with torch.save"});
  }
}

TEST(Pth, RefusesGlobalsAndOpcodesTorchRefusesNamingThem) {
  ExpectContains(ErrorOf([&] { LoadPth(kData + "forbidden_system.pth"); }),
                 {kData + "forbidden_system.pth: forbidden_system/data.pkl byte ",
                  ": opcode 0x63 GLOBAL 'posix.system' is not allowed",
                  "torch.load(weights_only=True) refuses it too"});
  ExpectContains(ErrorOf([&] { LoadPth(kData + "forbidden_eval.pth"); }),
                 {"opcode 0x63 GLOBAL 'builtins.eval' is not allowed"});
  ExpectContains(ErrorOf([&] { LoadPth(kData + "protocol4.pth"); }),
                 {"protocol4/data.pkl byte 2: opcode 0x95 FRAME is not allowed",
                  "torch.load(weights_only=True) refuses it too"});
}

// ------------------------------------------------------------------ archives built here

std::string Le(uint64_t v, int bytes) {
  std::string s(bytes, '\0');
  for (int i = 0; i < bytes; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

struct Entry {
  std::string name, data;
};

// A zip of stored entries as torch.save lays it out; `zip64` writes the
// ZIP64 end records and saturates the classic end record's fields, as a
// writer does past 4 GB or 65535 entries.
std::string Zip(const std::vector<Entry>& entries, bool zip64 = false) {
  std::string out, cd;
  for (const Entry& e : entries) {
    // version needed, flags, method (stored), time, date, CRC, sizes, name and extra lengths
    const std::string common = Le(20, 2) + Le(0, 2) + Le(0, 2) + Le(0, 2) + Le(0, 2) +
                               Le(Crc32(e.data.data(), e.data.size()), 4) + Le(e.data.size(), 4) +
                               Le(e.data.size(), 4) + Le(e.name.size(), 2) + Le(0, 2);
    cd += Le(0x02014b50, 4) + Le(20, 2) + common + Le(0, 2) + Le(0, 2) + Le(0, 2) + Le(0, 4) +
          Le(out.size(), 4) + e.name;
    out += Le(0x04034b50, 4) + common + e.name + e.data;
  }
  const uint64_t cd_offset = out.size();
  out += cd;
  if (zip64) {
    const uint64_t z64 = out.size();
    out += Le(0x06064b50, 4) + Le(44, 8) + Le(45, 2) + Le(45, 2) + Le(0, 4) + Le(0, 4) +
           Le(entries.size(), 8) + Le(entries.size(), 8) + Le(cd.size(), 8) + Le(cd_offset, 8);
    out += Le(0x07064b50, 4) + Le(0, 4) + Le(z64, 8) + Le(1, 4);
  }
  const uint64_t n = zip64 ? 0xffff : entries.size();
  out += Le(0x06054b50, 4) + Le(0, 2) + Le(0, 2) + Le(n, 2) + Le(n, 2) +
         Le(zip64 ? 0xffffffff : cd.size(), 4) + Le(zip64 ? 0xffffffff : cd_offset, 4) + Le(0, 2);
  return out;
}

// Pickle pieces, protocol 2 as torch writes them.
std::string Str(const std::string& s) { return StrCat("X", Le(s.size(), 4), s); }
std::string Int(int64_t v) { return StrCat("J", Le(static_cast<uint32_t>(v), 4)); }
std::string Tuple(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (int64_t x : v) s += Int(x);
  return s + "t";
}
// _rebuild_tensor_v2 of a torch.<type> storage `key` of `numel` elements.
std::string TensorPickle(const std::string& type, const std::string& key, int64_t numel,
                         int64_t offset, const std::vector<int64_t>& size,
                         const std::vector<int64_t>& stride) {
  return "ctorch._utils\n_rebuild_tensor_v2\n((" + Str("storage") + "ctorch\n" + type + "\n" +
         Str(key) + Str("cpu") + Int(numel) + "tQ" + Int(offset) + Tuple(size) + Tuple(stride) +
         "\x89" + "ccollections\nOrderedDict\n)Rt" + "R";
}
// {name: tensor, ...} pickled.
std::string DictPickle(const std::vector<std::pair<std::string, std::string>>& items) {
  std::string s = "\x80\x02}(";
  for (const auto& [k, v] : items) s += Str(k) + v;
  return s + "u.";
}
std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// Writes a torch-like archive "a/" of `pickle` and `data` entries; returns its path.
std::string WritePth(const std::string& dir, const std::string& name, const std::string& pickle,
                     std::vector<Entry> data = {}, bool zip64 = false) {
  std::vector<Entry> entries = {{"a/data.pkl", pickle}};
  for (Entry& e : data) entries.push_back({"a/data/" + e.name, std::move(e.data)});
  entries.push_back({"a/version", "3\n"});
  const std::string path = dir + "/" + name;
  WriteBytes(path, Zip(entries, zip64));
  return path;
}

TEST(Pth, ReadsAnArchiveBuiltHereWithAndWithoutZip64) {
  const std::string dir = TestDir();
  const std::string pickle =
      DictPickle({{"w", TensorPickle("FloatStorage", "0", 6, 1, {2, 2}, {1, 2})}});
  for (bool zip64 : {false, true}) {
    const SafetensorsFile f =
        LoadPth(WritePth(dir, "z.pth", pickle, {{"0", Floats({0, 1, 2, 3, 4, 5})}}, zip64));
    ASSERT_EQ(f.tensors.size(), 1u);
    const Tensor& w = f.tensors[0].second;
    ASSERT_EQ(w.shape(), Shape({2, 2}));
    // Element [i, j] is storage[1 + i + 2 j].
    EXPECT_EQ(w.At(0), 1);
    EXPECT_EQ(w.At(1), 3);
    EXPECT_EQ(w.At(2), 2);
    EXPECT_EQ(w.At(3), 4);
  }
}

TEST(Pth, TruncatedAndNonZipFilesAreNamedErrors) {
  const std::string dir = TestDir();
  const std::string whole = ReadBytes(kData + "dtypes.pth");
  ASSERT_GT(whole.size(), 1000u);
  // Every cut (in steps of 7 bytes, and the last 30 one by one) is an
  // Error naming the file: never a crash, another exception, or a load.
  for (size_t n = 0; n < whole.size(); n += (n + 30 < whole.size() ? 7 : 1)) {
    const std::string path = StrCat(dir, "/cut", n, ".pth");  // new files: no flush on truncation
    WriteBytes(path, whole.substr(0, n));
    const std::string error = ErrorOf([&] { LoadPth(path); });
    EXPECT_NE(error.find(path), std::string::npos) << n << " bytes: '" << error << "'";
  }
  WriteBytes(dir + "/cut.pth", whole.substr(0, whole.size() / 2));
  ExpectContains(ErrorOf([&] { LoadPth(dir + "/cut.pth"); }),
                 {"no zip end of central directory record", "truncated"});
  WriteBytes(dir + "/text.pth", "not weights at all, just some text that is long enough");
  for (auto load : {LoadPth, LoadWeightsFile}) {
    ExpectContains(ErrorOf([&] { load(dir + "/text.pth"); }),
                   {dir + "/text.pth", "not a zip archive"});
  }
  WriteBytes(dir + "/empty.pth", "");
  ExpectContains(ErrorOf([&] { LoadPth(dir + "/empty.pth"); }), {"0 bytes, too short"});
  ExpectContains(ErrorOf([&] { LoadPth(dir + "/none.pth"); }), {"cannot open"});
  // A zip, but not torch's.
  WriteBytes(dir + "/other.zip", Zip({{"readme.txt", "hello"}}));
  ExpectContains(ErrorOf([&] { LoadPth(dir + "/other.zip"); }),
                 {"not one torch.save wrote", "'readme.txt'"});
}

TEST(Pth, HostileArchivesAreNamedErrors) {
  const std::string dir = TestDir();
  const std::string ok = Zip({{"a/data.pkl", DictPickle({})}});
  EXPECT_TRUE(LoadPth(WritePth(dir, "ok.pth", DictPickle({}))).tensors.empty());
  auto error_of_bytes = [&](const std::string& bytes) {
    WriteBytes(dir + "/bad.pth", bytes);
    return ErrorOf([&] { LoadPth(dir + "/bad.pth"); });
  };
  const size_t end = ok.size() - 22;  // the end record
  std::string bad = ok;
  bad.replace(end + 16, 4, Le(1u << 30, 4));  // the central directory's offset
  ExpectContains(error_of_bytes(bad), {"the central directory", "lies outside"});
  bad = ok;
  bad.replace(end + 10, 2, Le(9999, 2));  // entries
  bad.replace(end + 8, 2, Le(9999, 2));
  ExpectContains(error_of_bytes(bad), {"9999 entries cannot fit"});
  bad = ok;
  bad.replace(end + 4, 2, Le(1, 2));  // disk number
  ExpectContains(error_of_bytes(bad), {"multi-disk"});
  bad = ok;
  bad.replace(ok.find("PK\1\2") + 20, 8, Le(1u << 29, 4) + Le(1u << 29, 4));  // its sizes
  ExpectContains(error_of_bytes(bad), {"'a/data.pkl'", "runs past the end"});
  bad.replace(ok.find("PK\1\2") + 20, 8, Le(1u << 31, 4) + Le(1u << 31, 4));
  ExpectContains(error_of_bytes(bad), {"a/data.pkl is 2147483648 bytes, over the 1073741824"});
  bad = ok;
  bad.replace(ok.find("PK\1\2") + 10, 2, Le(8, 2));  // deflated, 1:1 but not deflate data
  ExpectContains(error_of_bytes(bad), {"deflated entry 'a/data.pkl'", "corrupt"});
  bad = ok;
  bad.replace(ok.find("PK\1\2") + 10, 2, Le(12, 2));
  ExpectContains(error_of_bytes(bad), {"compression method 12"});
  bad = ok;
  bad[30 + 10 + 3] ^= 1;  // a pickle byte (the dict's MARK): the CRC no longer matches
  ExpectContains(error_of_bytes(bad), {"'a/data.pkl' fails its CRC-32 check"});
  bad = Zip({{"a/data.pkl", DictPickle({})}}, true);
  bad.replace(bad.size() - 22 - 20, 4, "PK\7\7");
  ExpectContains(error_of_bytes(bad), {"ZIP64", "no ZIP64 locator"});
}

TEST(Pth, HostilePicklesAreNamedErrors) {
  const std::string dir = TestDir();
  const Entry four = {"0", Floats({1, 2, 3, 4})};
  auto error_of = [&](const std::string& pickle, std::vector<Entry> data = {}) {
    const std::string path = WritePth(dir, "p.pth", pickle, std::move(data));
    return ErrorOf([&] { LoadPth(path); });
  };
  const std::string at = "a/data.pkl byte ";
  // Sizes the storage does not hold, or a storage the archive does not.
  ExpectContains(
      error_of(DictPickle({{"w", TensorPickle("FloatStorage", "0", 4, 0, {5}, {1})}}), {four}),
      {at, "a tensor of size [5] stride [1] at offset 0 reaches past its storage '0'"});
  ExpectContains(
      error_of(DictPickle({{"w", TensorPickle("FloatStorage", "0", 4, 2, {2, 2}, {2, 1})}}),
               {four}),
      {"reaches past its storage"});
  ExpectContains(
      error_of(DictPickle({{"w", TensorPickle("FloatStorage", "0", 1 << 30, 0, {4}, {1})}}),
               {four}),
      {"tensor 'w': a/data/0 holds 16 bytes, its FloatStorage of 1073741824 elements"});
  ExpectContains(error_of(DictPickle({{"w", TensorPickle("FloatStorage", "7", 4, 0, {4}, {1})}})),
                 {"tensor 'w': no entry a/data/7"});
  ExpectContains(
      error_of(DictPickle({{"w", TensorPickle("FloatStorage", "../0", 4, 0, {4}, {1})}})),
      {"storage key '../0' is not a plain name"});
  ExpectContains(error_of(DictPickle({{"w", TensorPickle("FloatStorage", "0", 4, 0, {4}, {-1})}})),
                 {"a negative size or stride (-1)"});
  // A broadcast of one element to 2^21: more than the storages hold, twice over.
  ExpectContains(
      error_of(DictPickle({{"w", TensorPickle("FloatStorage", "0", 4, 0, {1 << 21}, {0})}}),
               {four}),
      {"views repeat a storage too often"});
  ExpectContains(
      error_of(DictPickle({{"w", TensorPickle("ComplexFloatStorage", "0", 2, 0, {2}, {1})}}),
               {four}),
      {"GLOBAL 'torch.ComplexFloatStorage' is allowed by torch.load(weights_only=True) "
       "but not read by cnnflow"});
  // The machine itself.
  ExpectContains(error_of("\x80\x02R."), {at + "2: opcode 0x52 REDUCE: the stack is empty"});
  ExpectContains(error_of("\x80\x02h\x05."), {at + "2: opcode 0x68 BINGET: memo slot 5 is empty"});
  ExpectContains(error_of("\x80\x02\x8a\x09" + std::string(9, 'x') + "."),
                 {"opcode 0x8a LONG1: a 9-byte integer is wider"});
  ExpectContains(error_of("\x80\x02X\xff\xff\xff\x7f"), {"BINUNICODE: needs 2147483647 bytes"});
  ExpectContains(error_of("\x80\x02}"), {"ends at byte 3 without STOP"});
  ExpectContains(error_of("\x80\x02\x81."), {"opcode 0x81 NEWOBJ"});
  ExpectContains(error_of("\x80\x02"
                          "C\x01x."),
                 {"opcode 0x43 SHORT_BINBYTES is not allowed"});
  ExpectContains(error_of("\x80\x02"
                          "ctorch\nSize\n."),
                 {"'torch.Size' is allowed by torch"});
  ExpectContains(error_of("\x80\x02"
                          "ctorch\nFloatStorage\n)R."),
                 {"calls 'torch.FloatStorage', a class only read in persistent ids"});
  ExpectContains(error_of("\x80\x02]K\x01K\x02s."), {"SETITEM: the target is a list, not a dict"});
  ExpectContains(error_of("\x80\x02(K\x01K\x02u."), {"SETITEMS: the stack is empty"});
  ExpectContains(error_of("\x80\x02]K\x01K\x02u."), {"SETITEMS: no MARK to pop to"});
  ExpectContains(error_of("\x80\x02K\x01."), {"the saved object is an int, not a dict of tensors"});
  ExpectContains(error_of("\x80\x02}X\x01\x00\x00\x00kK\x01s."s),
                 {"not a state dict (its entry 'k' is an int)",
                  "no 'state_dict', 'model' or 'model_state_dict' entry"});
  ExpectContains(error_of("\x80\x02}}b."), {"opcode 0x62 BUILD: sets the state of a plain dict"});
  // A list holding itself through the memo: harmless (not a dict of tensors).
  ExpectContains(error_of("\x80\x02]q\x00h\x00"
                          "a."s),
                 {"the saved object is a list"});
}

}  // namespace
}  // namespace cnnflow
