// The `folder` source: samples straight from root/<class>/<image> equal the
// `lmdb` source's over the same folder converted (sample by sample, with
// and without augmentation); bad files are error values naming the file.
#include "loaders/folder_dataset.h"

#include <gtest/gtest.h>
#include <png.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "loaders/converter.h"
#include "loaders/jpeg_decoder.h"
#include "loaders/source_registry.h"
#include "ops/error.h"
#include "tests/loaders/png_fixture.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;
using Pixels = std::vector<uint8_t>;
constexpr int kH = 10, kW = 12;

Pixels Image(int c, int seed) {  // HWC
  Pixels p(static_cast<size_t>(kH) * kW * c);
  for (size_t i = 0; i < p.size(); ++i)
    p[i] = static_cast<uint8_t>((i * 13 + seed * 29 + i / 5) % 256);
  return p;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

std::shared_ptr<Dataset> Open(const std::string& source, const std::string& path,
                              const std::vector<int64_t>& shape, bool augment,
                              int resize_min_side = 0,
                              const std::map<std::string, ParamValue>& extra = {}) {
  const SourceType* type = SourceRegistry::Get().Find(source);
  EXPECT_NE(type, nullptr) << source;
  Args a;
  a.Set("path", path);
  if (!shape.empty()) a.Set("shape", shape);
  if (augment) {
    a.Set("pad", int64_t{2});
    a.Set("random_crop", true);
    a.Set("hflip", true);
  }
  a.Set("resize_min_side", int64_t{resize_min_side});
  for (const auto& [k, v] : extra) a.Set(k, v);
  a.FillDefaults(type->schema);
  return type->open(a);
}

class FolderDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestDir();
    root_ = dir_ + "/images";
    auto jpeg = [](const Pixels& px, int c) { return EncodeJpeg(px.data(), kW, kH, c, 90); };
    WriteFile(root_ + "/cat/0.jpg", jpeg(Image(3, 0), 3));
    WriteFile(root_ + "/cat/1.png", testing::WritePng(kW, kH, PNG_COLOR_TYPE_RGB, 8, Image(3, 1)));
    WriteFile(root_ + "/dog/2.png", testing::WritePng(kW, kH, PNG_COLOR_TYPE_GRAY, 8, Image(1, 2)));
    WriteFile(root_ + "/dog/3.jpg", jpeg(Image(1, 3), 1));
    WriteFile(root_ + "/emu/4.png",
              testing::WritePng(kW, kH, PNG_COLOR_TYPE_RGB_ALPHA, 8, Image(4, 4), true));
  }

  std::string dir_, root_;
};

TEST_F(FolderDatasetTest, ListsTheFolderAndTakesTheFirstImagesShape) {
  auto ds = Open("folder", root_, {}, false);
  EXPECT_EQ(ds->size(), 5);
  EXPECT_EQ(ds->num_classes(), 3);
  EXPECT_EQ(ds->sample_shape(), Shape({3, kH, kW}));  // from cat/0.jpg
  EXPECT_EQ(ds->Key(3), (fs::path(root_) / "dog" / "3.jpg").string());
  // Evaluation pass of a PNG: exactly the pixels written, CHW / 255.
  std::vector<float> x(3 * kH * kW);
  const ReadResult r = ds->Read(1, {0, 0, false}, x.data());
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.label, 0);
  const Pixels px = Image(3, 1);
  for (int c = 0; c < 3; ++c)
    for (int p = 0; p < kH * kW; ++p) ASSERT_FLOAT_EQ(x[c * kH * kW + p], px[p * 3 + c] / 255.f);
  EXPECT_EQ(ds->Read(2, {0, 0, false}, x.data()).label, 1);
  EXPECT_EQ(ds->Read(4, {0, 0, false}, x.data()).label, 2);
}

TEST_F(FolderDatasetTest, EqualsTheLmdbSourceOfTheSameFolderSampleBySample) {
  ConvertOptions o;
  o.from = "folder";
  o.src = root_;
  o.to = dir_ + "/images.lmdb";
  o.encoded = 1;
  ConvertToLmdb(o);
  o.to = dir_ + "/raw.lmdb";
  o.encoded = 0;
  ConvertToLmdb(o);
  struct Case {
    std::vector<int64_t> shape;
    bool augment;
    int resize_min_side;
    // Raw records hold RGB: equal only without JPEG's DCT-domain scaling,
    // and in colour (a colour JPEG decoded to gray is TurboJPEG's Y, raw RGB
    // made gray is OpenCV's luma: within a level or two).
    bool raw_too;
  };
  for (const Case& k : {Case{{3, kH, kW}, false, 0, true}, Case{{3, kH, kW}, true, 0, true},
                        Case{{1, 8, 8}, true, 0, false}, Case{{3, 6, 6}, true, 6, false}}) {
    auto folder = Open("folder", root_, k.shape, k.augment, k.resize_min_side);
    auto lmdb = Open("lmdb", dir_ + "/images.lmdb", k.shape, k.augment, k.resize_min_side);
    auto raw = Open("lmdb", dir_ + "/raw.lmdb", k.shape, k.augment, k.resize_min_side);
    ASSERT_EQ(folder->size(), lmdb->size());
    const size_t n = Shape(k.shape).numel();
    std::vector<float> a(n), b(n), c(n);
    int differ_across_epochs = 0;
    for (int64_t i = 0; i < folder->size(); ++i) {
      for (const ReadContext& ctx :
           {ReadContext{5, 0, true}, ReadContext{5, 1, true}, ReadContext{5, 2, false}}) {
        const ReadResult rf = folder->Read(i, ctx, a.data());
        const ReadResult rl = lmdb->Read(i, ctx, b.data());
        ASSERT_TRUE(rf.ok() && rl.ok()) << rf.error << rl.error;
        EXPECT_EQ(rf.label, rl.label);
        EXPECT_EQ(a, b) << "sample " << i << ", epoch " << ctx.epoch << ", resize "
                        << k.resize_min_side;
        if (k.raw_too) {
          ASSERT_TRUE(raw->Read(i, ctx, c.data()).ok());
          EXPECT_EQ(a, c) << "raw sample " << i;
        }
      }
      ASSERT_TRUE(folder->Read(i, {5, 3, true}, b.data()).ok());
      ASSERT_TRUE(folder->Read(i, {5, 4, true}, c.data()).ok());
      differ_across_epochs += b != c;
    }
    if (k.augment) {
      EXPECT_GT(differ_across_epochs, 0) << "augmentation had no effect";
    }
  }
}

TEST_F(FolderDatasetTest, BadFilesAreErrorsNamingThePath) {
  const std::string png = testing::WritePng(kW, kH, PNG_COLOR_TYPE_RGB, 8, Image(3, 7));
  WriteFile(root_ + "/emu/5.png", png.substr(0, png.size() - 40));      // truncated
  WriteFile(root_ + "/emu/6.jpg", "\xFF\xD8\xFF garbage, not a JPEG");  // JPEG magic only
  WriteFile(root_ + "/emu/7.png", "not an image");
  WriteFile(root_ + "/emu/8.png", png);  // removed after the scan
  auto ds = Open("folder", root_, {3, kH, kW}, true);
  ASSERT_EQ(ds->size(), 9);
  fs::remove(root_ + "/emu/8.png");
  std::vector<float> x(3 * kH * kW);
  const char* expected[] = {"truncated PNG", "corrupt JPEG", "unknown image format", "cannot open"};
  for (int i = 5; i <= 8; ++i) {
    const std::string path = ds->Key(i);
    const ReadResult r = ds->Read(i, {1, 0, true}, x.data());
    EXPECT_FALSE(r.ok()) << path;
    EXPECT_NE(r.error.find("'" + path + "'"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find(expected[i - 5]), std::string::npos) << r.error;
  }
  EXPECT_TRUE(ds->Read(4, {1, 0, true}, x.data()).ok());  // and good files still read
}

// Also with airbench's augmentation (reflect padding, alternating flip),
// over two epochs.
TEST_F(FolderDatasetTest, ManyThreadsReadTheSameSamplesAsOne) {
  const std::map<std::string, ParamValue> airbench = {{"pad_mode", std::string("reflect")},
                                                      {"hflip", std::string("alternate")}};
  for (const bool alternate : {false, true}) {
    auto ds = Open("folder", root_, {3, 8, 8}, true, 9,
                   alternate ? airbench : std::map<std::string, ParamValue>{});
    const size_t n = 3 * 8 * 8;
    for (const int64_t epoch : {1, 2}) {
      SCOPED_TRACE(::testing::Message()
                   << (alternate ? "airbench" : "default") << ", epoch " << epoch);
      const ReadContext ctx{2, epoch, true};
      std::vector<std::vector<float>> serial(ds->size(), std::vector<float>(n));
      for (int64_t i = 0; i < ds->size(); ++i) ASSERT_TRUE(ds->Read(i, ctx, serial[i].data()).ok());
      std::vector<int> mismatches(4, 0);
      std::vector<std::thread> threads;
      for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
          std::vector<float> x(n);
          for (int rep = 0; rep < 10; ++rep) {
            for (int64_t i = (t + rep) % ds->size(), k = 0; k < ds->size();
                 ++k, i = (i + 1) % ds->size()) {
              if (!ds->Read(i, ctx, x.data()).ok() || x != serial[i]) ++mismatches[t];
            }
          }
        });
      }
      for (auto& th : threads) th.join();
      EXPECT_EQ(mismatches, std::vector<int>(4, 0));
    }
  }
}

TEST_F(FolderDatasetTest, BadConfigurationsThrow) {
  try {
    Open("folder", dir_ + "/missing", {}, false);
    ADD_FAILURE() << "opened a missing folder";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir_ + "/missing"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Open("folder", root_, {4, kH, kW}, false), ConfigError);
  EXPECT_THROW(Open("folder", root_, {3, 0, kW}, false), ConfigError);
}

}  // namespace
}  // namespace cnnflow
