#include "loaders/idx_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "ops/error.h"
#include "tests/testing/helpers.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

using testing::TestDir;

// An IDX file: big-endian magic and dimensions, then `data`; gzip or plain.
void WriteIdx(const std::string& path, uint32_t magic, const std::vector<uint32_t>& dims,
              const std::vector<uint8_t>& data, bool gzip = true) {
  std::vector<uint8_t> bytes;
  auto be32 = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) bytes.push_back(static_cast<uint8_t>(v >> s));
  };
  be32(magic);
  for (uint32_t d : dims) be32(d);
  bytes.insert(bytes.end(), data.begin(), data.end());
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    ASSERT_EQ(gzclose(f), Z_OK);
  } else {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    std::fclose(f);
  }
}

// Three 2x3 images with pixel (i, k) = 40 i + k (image 2 ends in 255) and
// labels 0, 4, 2.
std::vector<uint8_t> Pixels() {
  std::vector<uint8_t> p;
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 6; ++k) p.push_back(static_cast<uint8_t>(40 * i + k));
  p.back() = 255;
  return p;
}

std::string OpenError(const std::string& images, const std::string& labels) {
  return testing::ErrorOf([&] { IdxDataset::Open(images, labels); });
}

TEST(IdxDataset, ReadsGzippedImagesAndLabels) {
  const std::string dir = TestDir();
  WriteIdx(dir + "/img.gz", 0x803, {3, 2, 3}, Pixels());
  WriteIdx(dir + "/lbl.gz", 0x801, {3}, {0, 4, 2});
  auto ds = IdxDataset::Open(dir + "/img.gz", dir + "/lbl.gz");
  EXPECT_EQ(ds->size(), 3);
  EXPECT_EQ(ds->sample_shape(), Shape({1, 2, 3}));
  EXPECT_EQ(ds->num_classes(), 5);
  std::vector<float> x(6);
  EXPECT_EQ(ds->Read(1, {}, x.data()).label, 4);
  for (int k = 0; k < 6; ++k) EXPECT_EQ(x[k], static_cast<float>(40 + k) / 255.f) << k;
  EXPECT_EQ(ds->Read(2, {}, x.data()).label, 2);
  EXPECT_EQ(x[0], 80.f / 255.f);
  EXPECT_EQ(x[5], 1.0f);
  EXPECT_EQ(ds->Read(0, {}, x.data()).label, 0);
  EXPECT_EQ(x[0], 0.0f);
  EXPECT_EQ(ds->pixels(2)[1], 81);
  EXPECT_NE(ds->description().find("img.gz"), std::string::npos);
  EXPECT_THROW(ds->Read(3, {}, x.data()), Error);
  EXPECT_THROW(ds->Read(-1, {}, x.data()), Error);
}

TEST(IdxDataset, ReadsUncompressedFiles) {
  const std::string dir = TestDir();
  WriteIdx(dir + "/img", 0x803, {3, 2, 3}, Pixels(), /*gzip=*/false);
  WriteIdx(dir + "/lbl", 0x801, {3}, {1, 1, 1}, /*gzip=*/false);
  auto ds = IdxDataset::Open(dir + "/img", dir + "/lbl");
  EXPECT_EQ(ds->size(), 3);
  EXPECT_EQ(ds->num_classes(), 2);
  std::vector<float> x(6);
  EXPECT_EQ(ds->Read(1, {}, x.data()).label, 1);
  EXPECT_EQ(x[3], 43.f / 255.f);
}

TEST(IdxDataset, AllZeroLabelsGiveOneClass) {
  const std::string dir = TestDir();
  WriteIdx(dir + "/img.gz", 0x803, {3, 2, 3}, Pixels());
  WriteIdx(dir + "/lbl.gz", 0x801, {3}, {0, 0, 0});
  EXPECT_EQ(IdxDataset::Open(dir + "/img.gz", dir + "/lbl.gz")->num_classes(), 1);
}

TEST(IdxDataset, MissingFileNamesIt) {
  const std::string dir = TestDir();
  WriteIdx(dir + "/lbl.gz", 0x801, {3}, {0, 4, 2});
  const std::string msg = OpenError(dir + "/nope.gz", dir + "/lbl.gz");
  EXPECT_NE(msg.find(dir + "/nope.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;
}

TEST(IdxDataset, BadMagicSaysFoundAndExpected) {
  const std::string dir = TestDir();
  WriteIdx(dir + "/img.gz", 0x803, {3, 2, 3}, Pixels());
  WriteIdx(dir + "/lbl.gz", 0x801, {3}, {0, 4, 2});
  // Images and labels swapped.
  const std::string msg = OpenError(dir + "/lbl.gz", dir + "/img.gz");
  EXPECT_NE(msg.find(dir + "/lbl.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bad magic number 0x00000801, expected 0x00000803"), std::string::npos) << msg;
}

TEST(IdxDataset, TruncatedDataSaysExpectedAndGotBytes) {
  const std::string dir = TestDir();
  const std::vector<uint8_t> pixels = Pixels();
  const std::vector<uint8_t> two_images(pixels.begin(), pixels.begin() + 12);
  WriteIdx(dir + "/img.gz", 0x803, {3, 2, 3}, two_images);
  WriteIdx(dir + "/lbl.gz", 0x801, {3}, {0, 4, 2});
  std::string msg = OpenError(dir + "/img.gz", dir + "/lbl.gz");
  EXPECT_NE(msg.find(dir + "/img.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated data: expected 18 bytes, got 12"), std::string::npos) << msg;

  WriteIdx(dir + "/short.gz", 0x803, {3}, {});  // header cut after one dimension
  msg = OpenError(dir + "/short.gz", dir + "/lbl.gz");
  EXPECT_NE(msg.find("truncated header"), std::string::npos) << msg;
}

TEST(IdxDataset, CountMismatchNamesBothFiles) {
  const std::string dir = TestDir();
  WriteIdx(dir + "/img.gz", 0x803, {3, 2, 3}, Pixels());
  WriteIdx(dir + "/lbl.gz", 0x801, {2}, {0, 4});
  const std::string msg = OpenError(dir + "/img.gz", dir + "/lbl.gz");
  EXPECT_NE(msg.find("has 3 images but"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir + "/lbl.gz' has 2 labels"), std::string::npos) << msg;
}

TEST(IdxDataset, CorruptGzipIsAnError) {
  const std::string dir = TestDir();
  WriteIdx(dir + "/img.gz", 0x803, {3, 2, 3}, Pixels());
  WriteIdx(dir + "/lbl.gz", 0x801, {3}, {0, 4, 2});
  // Keep the gzip magic, damage the deflate stream.
  FILE* f = std::fopen((dir + "/img.gz").c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, 12, SEEK_SET);
  const char junk[8] = {'\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\xff'};
  std::fwrite(junk, 1, sizeof junk, f);
  std::fclose(f);
  const std::string msg = OpenError(dir + "/img.gz", dir + "/lbl.gz");
  EXPECT_NE(msg.find(dir + "/img.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("read error"), std::string::npos) << msg;
}

TEST(IdxDataset, FashionMnistTestSet) {
  const std::string images = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
  const std::string labels = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
  if (!fs::exists(images) || !fs::exists(labels)) GTEST_SKIP() << "no " << images;
  auto ds = IdxDataset::Open(images, labels);
  EXPECT_EQ(ds->size(), 10000);
  EXPECT_EQ(ds->sample_shape(), Shape({1, 28, 28}));
  EXPECT_EQ(ds->num_classes(), 10);
  std::vector<int> count(10, 0);
  for (int64_t i = 0; i < ds->size(); ++i) {
    const int64_t l = ds->label(i);
    ASSERT_GE(l, 0);
    ASSERT_LT(l, 10);
    ++count[l];
  }
  for (int c = 0; c < 10; ++c) EXPECT_EQ(count[c], 1000) << c;  // balanced test set
  std::vector<float> x(28 * 28);
  EXPECT_EQ(ds->Read(0, {}, x.data()).label, 9);  // the first test image is an ankle boot
  float lo = 1, hi = 0;
  for (float v : x) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_EQ(lo, 0.0f);
  EXPECT_GT(hi, 0.5f);
  EXPECT_LE(hi, 1.0f);
}

}  // namespace
}  // namespace cnnflow
