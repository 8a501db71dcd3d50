// LmdbReader / LmdbWriter on LMDBs made here, in the test's own directory.
#include "loaders/lmdb_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "loaders/record.h"
#include "ops/error.h"
#include "tests/testing/helpers.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(text, part)                                         \
  do {                                                                      \
    const std::string text_ = (text);                                       \
    EXPECT_NE(text_.find(part), std::string::npos) << "message: " << text_; \
  } while (0)

using testing::ErrorOf;

// A value of varying length and content for record i.
std::string ValueFor(int i, size_t len) {
  std::string v(len, '\0');
  for (size_t j = 0; j < len; ++j) v[j] = static_cast<char>((i * 131 + j * 7) & 0xFF);
  return v;
}

TEST(LmdbStore, IndexKeyIsZeroPadded) {
  EXPECT_EQ(LmdbWriter::IndexKey(0), "00000000");
  EXPECT_EQ(LmdbWriter::IndexKey(1234), "00001234");
  EXPECT_EQ(LmdbWriter::IndexKey(123456789), "123456789");
}

TEST(LmdbStore, WriteThenReadFromTwoThreads) {
  const std::string path = testing::TestDir() + "/db";
  constexpr int kN = 600;
  std::vector<std::string> values(kN);
  {
    LmdbWriter::Options opt;
    opt.commit_every = 64;
    LmdbWriter w(path, opt);
    for (int i = 0; i < kN; ++i) {
      values[i] = ValueFor(i, 1 + (i * 37) % 500);
      w.Put(LmdbWriter::IndexKey(i), values[i]);
    }
    EXPECT_EQ(w.count(), kN);
    EXPECT_FALSE(fs::exists(path));  // atomic: only the .tmp exists before Finish
    w.Finish();
  }
  EXPECT_TRUE(fs::exists(path + "/data.mdb"));
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  LmdbReader reader(path);
  ASSERT_EQ(reader.size(), kN);
  for (int i = 0; i < kN; ++i) ASSERT_EQ(reader.Key(i), LmdbWriter::IndexKey(i));

  // Two threads, opposite orders, each keeping its first views to check they
  // stay valid while its transaction lives.
  std::vector<int> mismatches(2, 0);
  auto work = [&](int t) {
    std::vector<std::string_view> kept;
    for (int round = 0; round < 3; ++round) {
      for (int k = 0; k < kN; ++k) {
        const int i = t == 0 ? k : kN - 1 - k;
        const std::string_view v = reader.Get(i);
        if (v != values[i]) ++mismatches[t];
        if (round == 0 && k < 50) kept.push_back(v);
      }
    }
    for (int k = 0; k < 50; ++k) {
      const int i = t == 0 ? k : kN - 1 - k;
      if (kept[k] != values[i]) ++mismatches[t];
    }
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  EXPECT_EQ(mismatches[0], 0);
  EXPECT_EQ(mismatches[1], 0);
  // Threads that exited returned their transactions; new ones reuse them.
  std::thread c(work, 0);
  c.join();
  EXPECT_EQ(mismatches[0], 0);

  EXPECT_CONTAINS(ErrorOf([&] { reader.Get(kN); }), "index 600 out of range [0, 600)");
  EXPECT_CONTAINS(ErrorOf([&] { reader.Get(-1); }), "out of range");
}

TEST(LmdbStore, KeysComeOutSortedAndDuplicatesAreRejected) {
  const std::string path = testing::TestDir() + "/db";
  std::vector<int> order(200);
  for (int i = 0; i < 200; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  {
    LmdbWriter::Options opt;
    opt.commit_every = 17;
    LmdbWriter w(path, opt);
    for (int i : order) w.Put(LmdbWriter::IndexKey(i), ValueFor(i, 10));
    // Duplicate of a key appended last and of one in an earlier commit.
    EXPECT_CONTAINS(ErrorOf([&] { w.Put(LmdbWriter::IndexKey(order.back()), "x"); }),
                    "duplicate key");
    EXPECT_CONTAINS(ErrorOf([&] { w.Put(LmdbWriter::IndexKey(order.front()), "x"); }),
                    "duplicate key '" + LmdbWriter::IndexKey(order.front()) + "'");
    w.Put("zz-variable-length-key", "last");
    w.Finish();
    w.Finish();  // idempotent
  }
  LmdbReader reader(path);
  ASSERT_EQ(reader.size(), 201);
  for (int i = 0; i < 200; ++i) {
    ASSERT_EQ(reader.Key(i), LmdbWriter::IndexKey(i));
    ASSERT_EQ(reader.Get(i), ValueFor(i, 10)) << i;
  }
  EXPECT_EQ(reader.Key(200), "zz-variable-length-key");
  EXPECT_EQ(reader.Get(200), "last");
}

TEST(LmdbStore, MapGrowsWhenFull) {
  const std::string path = testing::TestDir() + "/db";
  constexpr int kN = 400;
  LmdbWriter::Options opt;
  opt.initial_map_size = 64 << 10;  // 64 KiB; the data is ~1.2 MiB
  opt.commit_every = 150;
  size_t final_map = 0;
  {
    LmdbWriter w(path, opt);
    const size_t initial = w.map_size();
    for (int i = 0; i < kN; ++i) w.Put(LmdbWriter::IndexKey(i), ValueFor(i, 3000));
    w.Finish();
    final_map = w.map_size();
    EXPECT_GE(final_map, initial * 16) << "the map must have doubled several times";
  }
  EXPECT_GT(fs::file_size(path + "/data.mdb"), size_t{kN} * 3000);
  LmdbReader reader(path);
  ASSERT_EQ(reader.size(), kN);
  for (int i = 0; i < kN; ++i) ASSERT_EQ(reader.Get(i), ValueFor(i, 3000)) << i;
}

TEST(LmdbStore, OpenErrorsNameThePath) {
  const std::string dir = testing::TestDir();
  EXPECT_EQ(ErrorOf([&] { LmdbReader r(dir + "/missing"); }),
            "LMDB path does not exist: '" + dir + "/missing'");

  fs::create_directories(dir + "/plain_dir");
  EXPECT_EQ(ErrorOf([&] { LmdbReader r(dir + "/plain_dir"); }),
            "'" + dir + "/plain_dir' is a directory without data.mdb: not an LMDB");

  {
    std::ofstream f(dir + "/garbage.bin", std::ios::binary);
    f << std::string(64 << 10, 'g');
  }
  const std::string garbage = ErrorOf([&] { LmdbReader r(dir + "/garbage.bin"); });
  EXPECT_CONTAINS(garbage, "mdb_env_open failed for LMDB '" + dir + "/garbage.bin'");
  EXPECT_CONTAINS(garbage, "MDB_INVALID");

  fs::create_directories(dir + "/fake_db");
  {
    std::ofstream f(dir + "/fake_db/data.mdb", std::ios::binary);
    f << "not an lmdb";
  }
  EXPECT_CONTAINS(ErrorOf([&] { LmdbReader r(dir + "/fake_db"); }),
                  "mdb_env_open failed for LMDB '" + dir + "/fake_db'");

  {
    LmdbWriter w(dir + "/empty");
    w.Finish();
  }
  EXPECT_EQ(ErrorOf([&] { LmdbReader r(dir + "/empty"); }),
            "LMDB '" + dir + "/empty' holds no records (empty database)");
}

TEST(LmdbStore, OpensTheDataFileItself) {
  const std::string path = testing::TestDir() + "/db";
  {
    LmdbWriter w(path);
    for (int i = 0; i < 5; ++i) w.Put(LmdbWriter::IndexKey(i), ValueFor(i, 20));
    w.Finish();
  }
  LmdbReader reader(path + "/data.mdb");  // MDB_NOSUBDIR
  ASSERT_EQ(reader.size(), 5);
  EXPECT_EQ(reader.Get(4), ValueFor(4, 20));
}

TEST(LmdbStore, WriterIsAtomicAndRefusesToOverwrite) {
  const std::string path = testing::TestDir() + "/db";
  {
    LmdbWriter w(path);
    w.Put("a", "1");
    EXPECT_TRUE(fs::exists(path + ".tmp"));
  }  // abandoned: nothing left behind
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  {
    LmdbWriter w(path);
    w.Put("a", "old");
    w.Finish();
  }
  EXPECT_EQ(ErrorOf([&] { LmdbWriter w(path); }),
            "LMDB '" + path + "' already exists (set overwrite to replace it)");
  {
    LmdbWriter::Options opt;
    opt.overwrite = true;
    LmdbWriter w(path, opt);
    w.Put("b", "new");
    {
      LmdbReader old(path);  // the old data set stays readable until Finish
      EXPECT_EQ(old.Get(0), "old");
    }
    w.Finish();
    EXPECT_CONTAINS(ErrorOf([&] { w.Put("c", "x"); }), "Put after Finish");
  }
  LmdbReader r(path);
  ASSERT_EQ(r.size(), 1);
  EXPECT_EQ(r.Key(0), "b");
  EXPECT_EQ(r.Get(0), "new");
}

TEST(LmdbStore, ReleaseThreadTransactionAndManyReaders) {
  const std::string path = testing::TestDir() + "/db";
  {
    LmdbWriter w(path);
    for (int i = 0; i < 10; ++i) w.Put(LmdbWriter::IndexKey(i), ValueFor(i, 8));
    w.Finish();
  }
  LmdbReader keep(path);
  EXPECT_EQ(keep.Get(3), ValueFor(3, 8));
  keep.ReleaseThreadTransaction();
  EXPECT_EQ(keep.Get(7), ValueFor(7, 8));  // renewed
  // Readers come and go on this thread: stale per-thread entries are pruned,
  // never reused for a new reader.
  for (int round = 0; round < 5; ++round) {
    LmdbReader r(path);
    EXPECT_EQ(r.Get(round), ValueFor(round, 8));
  }
  EXPECT_EQ(keep.Get(9), ValueFor(9, 8));
}

// A Caffe-format LMDB whose Datums are written by a hand-built protobuf
// encoder (not record.cc's), read back through LmdbReader + DecodeRecord.
TEST(LmdbStore, CaffeDatumLmdbFromHandBuiltEncoder) {
  auto varint = [](std::string* s, uint64_t v) {
    for (; v >= 0x80; v >>= 7) s->push_back(static_cast<char>(0x80 | (v & 0x7F)));
    s->push_back(static_cast<char>(v));
  };
  const std::string path = testing::TestDir() + "/caffe_db";
  constexpr int kN = 30, kC = 3, kH = 4, kW = 5;
  std::vector<std::string> pixels(kN);
  {
    LmdbWriter w(path);
    for (int i = 0; i < kN; ++i) {
      pixels[i] = ValueFor(i, kC * kH * kW);
      std::string d;
      d += '\x08', varint(&d, kC);                                // channels
      d += '\x10', varint(&d, kH);                                // height
      d += '\x18', varint(&d, kW);                                // width
      d += '\x22', varint(&d, pixels[i].size()), d += pixels[i];  // data
      d += '\x28', varint(&d, i % 10);                            // label
      w.Put(LmdbWriter::IndexKey(i), d);
    }
    w.Finish();
  }
  LmdbReader reader(path);
  ASSERT_EQ(reader.size(), kN);
  RecordView r;
  for (int i = 0; i < kN; ++i) {
    const std::string_view value = reader.Get(i);
    const RecordStatus st = DecodeRecord(value, &r);
    ASSERT_TRUE(st.ok()) << reader.Key(i) << ": " << st.message();
    EXPECT_EQ(r.label, i % 10);
    EXPECT_EQ(r.shape, (std::vector<int64_t>{kC, kH, kW}));
    EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(r.data), r.size), pixels[i]);
    // Zero-copy: the pixels are inside the LMDB value (the memory map).
    EXPECT_GE(reinterpret_cast<const char*>(r.data), value.data());
    EXPECT_LE(reinterpret_cast<const char*>(r.data) + r.size, value.data() + value.size());
  }
}

// A short value stored in an LMDB is reported, not read past.
TEST(LmdbStore, ShortValueIsAnErrorValue) {
  const std::string path = testing::TestDir() + "/db";
  const std::string pixels(12, 'p');
  RecordView in;
  in.label = 1;
  in.shape = {3, 2, 2};
  in.data = reinterpret_cast<const uint8_t*>(pixels.data());
  in.size = pixels.size();
  const std::string full = EncodeCnnflowRecord(in);
  {
    LmdbWriter w(path);
    w.Put(LmdbWriter::IndexKey(0), full);
    w.Put(LmdbWriter::IndexKey(1), full.substr(0, full.size() - 5));
    w.Finish();
  }
  LmdbReader reader(path);
  RecordView r;
  EXPECT_TRUE(DecodeRecord(reader.Get(0), &r).ok());
  EXPECT_EQ(DecodeRecord(reader.Get(1), &r).message(),
            "value is 55 bytes, header (48) + payload (12) = 60 (truncated)");
}

}  // namespace
}  // namespace cnnflow
