// The `cifar` source: real CIFAR-10 images (tests/data/cifar10-jpeg-sample,
// 20 JPEGs of the JPEG set) decoded and written in the official binary
// layout read back as the `folder` source reads the JPEGs themselves,
// bitwise, with and without augmentation; CIFAR-100's two labels; the
// official folder layout by split; and the errors (a partial record named
// by file and offset, a label out of range, a missing batch, a file name
// that tells no format).
#include "loaders/cifar_dataset.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "loaders/folder_dataset.h"
#include "loaders/image_decoder.h"
#include "ops/error.h"
#include "tests/testing/helpers.h"
#include "tests/testing/open_source.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;
using Floats = std::vector<float>;

std::string SampleFolder() {
  const char* src = std::getenv("CNNFLOW_SOURCE_DIR");
  return (fs::path(src ? src : ".") / "tests/data/cifar10-jpeg-sample").string();
}

// One record: label byte(s), then the HWC pixels as R, G, B planes.
std::string Record(const std::vector<uint8_t>& labels, const uint8_t* hwc) {
  std::string r(labels.begin(), labels.end());
  const size_t plane = 32 * 32;
  for (int c = 0; c < 3; ++c) {
    for (size_t p = 0; p < plane; ++p) r.push_back(static_cast<char>(hwc[3 * p + c]));
  }
  return r;
}

std::string Pattern(int seed) {  // HWC
  std::string p(CifarDataset::kPixels, '\0');
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<char>((i * 7 + seed * 31) % 256);
  return p;
}

Floats ReadSample(const Dataset& ds, int64_t i, const ReadContext& ctx, int64_t* label) {
  Floats x(static_cast<size_t>(ds.sample_shape().numel()), -99.f);
  const ReadResult r = ds.Read(i, ctx, x.data());
  EXPECT_TRUE(r.ok()) << r.error;
  *label = r.label;
  return x;
}

TEST(CifarDatasetTest, RealImagesAsABinaryBatchEqualTheFolderSourcesDecode) {
  const std::string dir = testing::TestDir();
  const std::map<std::string, ParamValue> augment = {
      {"pad", int64_t{4}}, {"random_crop", true}, {"hflip", true}};
  auto with = [&](std::map<std::string, ParamValue> v, bool aug) {
    if (aug) v.insert(augment.begin(), augment.end());
    return v;
  };
  for (const bool aug : {false, true}) {
    auto folder = testing::OpenSource(
        "folder",
        with({{"path", SampleFolder()}, {"shape", std::vector<int64_t>{3, 32, 32}}}, aug));
    ASSERT_EQ(folder->size(), 20);
    ASSERT_EQ(folder->num_classes(), 10);
    // The binary batch: each JPEG decoded (TurboJPEG, as the folder source
    // decodes it), in the folder's order.
    std::string batch;
    for (int64_t i = 0; i < folder->size(); ++i) {
      std::vector<uint8_t> bytes, hwc;
      ASSERT_EQ(ReadWholeFile(folder->Key(i), &bytes), "");
      const ImageResult img = DecodeImage(bytes.data(), bytes.size(), 3, &hwc);
      ASSERT_TRUE(img.ok()) << img.error;
      ASSERT_EQ(img.width, 32);
      ASSERT_EQ(img.height, 32);
      batch += Record({static_cast<uint8_t>(i / 2)}, hwc.data());
    }
    const std::string file = dir + "/test_batch.bin";
    testing::WriteBytes(file, batch);
    auto cifar = testing::OpenSource("cifar", with({{"path", file}}, aug));
    ASSERT_EQ(cifar->size(), 20);
    EXPECT_EQ(cifar->sample_shape(), (Shape{3, 32, 32}));
    EXPECT_EQ(cifar->num_classes(), 10);
    for (const bool train : {false, true}) {
      for (int64_t epoch : {0, 1}) {
        const ReadContext ctx{7, epoch, train};
        for (int64_t i = 0; i < 20; ++i) {
          int64_t want_label = -1, got_label = -2;
          const Floats want = ReadSample(*folder, i, ctx, &want_label);
          const Floats got = ReadSample(*cifar, i, ctx, &got_label);
          EXPECT_EQ(got_label, want_label) << i;
          EXPECT_EQ(got_label, i / 2) << i;
          ASSERT_EQ(got, want) << "sample " << i << " (" << folder->Key(i) << "), augment " << aug
                               << ", train " << train << ", epoch " << epoch;
        }
      }
    }
  }
}

TEST(CifarDatasetTest, Cifar100TakesTheFineLabelOrTheCoarseOne) {
  const std::string dir = testing::TestDir();
  std::string file;
  for (int i = 0; i < 4; ++i) {
    const std::string px = Pattern(i);
    file += Record({static_cast<uint8_t>(i + 10), static_cast<uint8_t>(i + 90)},
                   reinterpret_cast<const uint8_t*>(px.data()));
  }
  testing::WriteBytes(dir + "/train.bin", file);
  auto fine = testing::OpenSource("cifar", {{"path", dir + "/train.bin"}});
  auto coarse = testing::OpenSource("cifar", {{"path", dir}, {"label", std::string("coarse")}});
  EXPECT_EQ(fine->num_classes(), 100);
  EXPECT_EQ(coarse->num_classes(), 20);
  const ReadContext ctx{0, 0, false};
  for (int64_t i = 0; i < 4; ++i) {
    int64_t lf = -1, lc = -1;
    const Floats xf = ReadSample(*fine, i, ctx, &lf);
    const Floats xc = ReadSample(*coarse, i, ctx, &lc);
    EXPECT_EQ(lf, i + 90);
    EXPECT_EQ(lc, i + 10);
    EXPECT_EQ(xf, xc);
    // Pixel (y, x, c) of the sample is byte 3 * (32 y + x) + c of the HWC pattern.
    const std::string px = Pattern(static_cast<int>(i));
    EXPECT_EQ(xf[0], static_cast<uint8_t>(px[0]) / 255.f);                   // c 0, (0, 0)
    EXPECT_EQ(xf[1024 + 33], static_cast<uint8_t>(px[3 * 33 + 1]) / 255.f);  // c 1, (1, 1)
  }
  testing::ExpectContains(
      testing::ErrorOf([&] {
        testing::OpenSource("cifar", {{"path", dir}, {"split", std::string("test")}});
      }),
      {"no test.bin (the test split)"});
}

TEST(CifarDatasetTest, TheOfficialFolderBySplit) {
  const std::string dir = testing::TestDir();
  const std::string px = Pattern(0);
  const auto* hwc = reinterpret_cast<const uint8_t*>(px.data());
  for (int b = 1; b <= 5; ++b) {
    testing::WriteBytes(StrCat(dir, "/data_batch_", b, ".bin"),
                        Record({static_cast<uint8_t>(b)}, hwc) + Record({0}, hwc));
  }
  testing::WriteBytes(dir + "/test_batch.bin", Record({9}, hwc));
  auto train = testing::OpenSource("cifar", {{"path", dir}});
  auto test = testing::OpenSource("cifar", {{"path", dir}, {"split", std::string("test")}});
  EXPECT_EQ(train->size(), 10);
  EXPECT_EQ(test->size(), 1);
  EXPECT_EQ(train->Key(4), dir + "/data_batch_3.bin record 0 (offset 0)");
  EXPECT_EQ(train->Key(5), dir + "/data_batch_3.bin record 1 (offset 3073)");
  int64_t label = -1;
  ReadSample(*train, 4, {0, 0, false}, &label);
  EXPECT_EQ(label, 3);
  fs::remove(dir + "/data_batch_4.bin");
  testing::ExpectContains(testing::ErrorOf([&] {
                            testing::OpenSource("cifar", {{"path", dir}});
                          }),
                          {dir, "no data_batch_4.bin (the train split)"});
}

TEST(CifarDatasetTest, ErrorsNameTheFileAndTheOffset) {
  const std::string dir = testing::TestDir();
  const std::string px = Pattern(1);
  const auto* hwc = reinterpret_cast<const uint8_t*>(px.data());
  const std::string file = dir + "/data_batch_1.bin";
  testing::WriteBytes(file, Record({1}, hwc) + Record({2}, hwc) + "12345");
  testing::ExpectContains(testing::ErrorOf([&] {
                            testing::OpenSource("cifar", {{"path", file}});
                          }),
                          {file, "6151 bytes is not a whole number of 3073-byte records",
                           "the record at offset 6146 has only 5 bytes"});

  // A label past the classes is a bad record (on_bad_record decides).
  testing::WriteBytes(file, Record({1}, hwc) + Record({12}, hwc));
  auto ds = testing::OpenSource("cifar", {{"path", file}});
  Floats x(CifarDataset::kPixels);
  EXPECT_TRUE(ds->Read(0, {}, x.data()).ok());
  const ReadResult bad = ds->Read(1, {}, x.data());
  EXPECT_EQ(bad.error, file + " record 1 (offset 3073): label 12 out of range [0, 10)");

  // A name that tells no format needs format:.
  const std::string other = dir + "/cifar.bin";
  testing::WriteBytes(other, Record({1}, hwc));
  testing::ExpectContains(testing::ErrorOf([&] {
                            testing::OpenSource("cifar", {{"path", other}});
                          }),
                          {other, "give format: cifar10 or cifar100"});
  EXPECT_EQ(
      testing::OpenSource("cifar", {{"path", other}, {"format", std::string("cifar10")}})->size(),
      1);
  testing::ExpectContains(
      testing::ErrorOf([&] {
        testing::OpenSource("cifar", {{"path", file}, {"label", std::string("coarse")}});
      }),
      {"label: coarse is CIFAR-100's"});
  testing::ExpectContains(testing::ErrorOf([&] {
                            testing::OpenSource("cifar", {{"path", dir + "/none.bin"}});
                          }),
                          {dir + "/none.bin"});
}

}  // namespace
}  // namespace cnnflow
