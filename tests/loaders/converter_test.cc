// ConvertToLmdb end to end: an image folder of JPEG and PNG files (and IDX
// files) made here -> a real LMDB -> the `lmdb` source, whose samples must
// equal the images decoded directly; --resize against cv::resize; shuffle,
// limit, and bad input.
#include "loaders/converter.h"

#include <gtest/gtest.h>
#include <png.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "loaders/image_folder.h"
#include "loaders/jpeg_decoder.h"
#include "loaders/lmdb_store.h"
#include "loaders/record.h"
#include "loaders/source_registry.h"
#include "ops/error.h"
#include "tests/loaders/png_fixture.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;
using Pixels = std::vector<uint8_t>;
constexpr int kH = 10, kW = 12;

// Smooth content (JPEG codes it well), different per seed and channel. HWC.
Pixels Smooth(int c, int seed) {
  Pixels p(static_cast<size_t>(kH) * kW * c);
  for (int y = 0; y < kH; ++y)
    for (int x = 0; x < kW; ++x)
      for (int ch = 0; ch < c; ++ch)
        p[(y * kW + x) * c + ch] = static_cast<uint8_t>(15 + 8 * x + 6 * y + 18 * ch + 4 * seed +
                                                        8 * std::sin(0.5 * x + ch));
  return p;
}

Pixels ToRgb(const Pixels& gray) {
  Pixels rgb;
  for (uint8_t g : gray) rgb.insert(rgb.end(), 3, g);
  return rgb;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

// A folder of 3 classes: RGB and gray JPEGs; RGB, 16-bit gray, interlaced
// RGBA and palette PNGs. Remembers each file's pixels as the `lmdb` source
// must give them ([H, W, 3]): PNGs the pixels written (alpha dropped, gray
// replicated), JPEGs TurboJPEG's own decode.
struct ImageFolderFixture {
  std::string root;
  std::map<std::string, Pixels> rgb;    // path -> HWC3
  std::map<std::string, int> channels;  // path -> channels of a raw record

  explicit ImageFolderFixture(const std::string& dir) : root(dir + "/images") {
    auto jpeg = [&](const std::string& name, const Pixels& px, int c) {
      const std::string bytes = EncodeJpeg(px.data(), kW, kH, c, 90);
      Pixels decoded(static_cast<size_t>(kW) * kH * 3);
      JpegDecoder dec;
      EXPECT_TRUE(dec.Decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 3,
                             decoded.data(), decoded.size())
                      .ok());
      Add(name, bytes, decoded, c);
    };
    jpeg("a/0.jpg", Smooth(3, 0), 3);
    const Pixels rgb1 = Smooth(3, 1);
    Add("a/1.png", testing::WritePng(kW, kH, PNG_COLOR_TYPE_RGB, 8, rgb1), rgb1, 3);
    const Pixels gray2 = Smooth(1, 2);
    Pixels be16;
    for (uint8_t g : gray2) be16.insert(be16.end(), {g, static_cast<uint8_t>(255 - g)});
    Add("b/2.png", testing::WritePng(kW, kH, PNG_COLOR_TYPE_GRAY, 16, be16), ToRgb(gray2), 1);
    jpeg("b/3.jpg", Smooth(1, 3), 1);
    const Pixels rgba = Smooth(4, 4);
    Pixels rgb4;
    for (size_t i = 0; i < rgba.size(); i += 4) rgb4.insert(rgb4.end(), &rgba[i], &rgba[i] + 3);
    Add("c/4.png", testing::WritePng(kW, kH, PNG_COLOR_TYPE_RGB_ALPHA, 8, rgba, true), rgb4, 3);
    std::vector<uint8_t> palette, index;
    for (int i = 0; i < 4; ++i)
      palette.insert(palette.end(),
                     {uint8_t(60 + 20 * i), uint8_t(200 - 15 * i), uint8_t(90 + 10 * i)});
    Pixels rgb5;
    for (int i = 0; i < kH * kW; ++i) {
      index.push_back(static_cast<uint8_t>((i % kW) / 3));
      rgb5.insert(rgb5.end(), &palette[index.back() * 3], &palette[index.back() * 3] + 3);
    }
    Add("c/5.png", testing::WritePng(kW, kH, PNG_COLOR_TYPE_PALETTE, 8, index, false, palette),
        rgb5, 3);
  }

  void Add(const std::string& name, const std::string& bytes, const Pixels& hwc3, int c) {
    const std::string path = (fs::path(root) / name).string();
    WriteFile(path, bytes);
    rgb[path] = hwc3;
    channels[path] = c;
  }
};

std::shared_ptr<Dataset> OpenLmdb(const std::string& path, int h, int w) {
  const SourceType* type = SourceRegistry::Get().Find("lmdb");
  EXPECT_NE(type, nullptr);
  Args a;
  a.Set("path", path);
  a.Set("shape", std::vector<int64_t>{3, h, w});
  a.FillDefaults(type->schema);
  return type->open(a);
}

// Reads sample i (evaluation pass: no augmentation) and checks it equals the
// HWC3 pixels / 255, within `tolerance` grey levels (mean) and max_diff.
void ExpectSample(const Dataset& ds, int64_t i, const Pixels& hwc3, int h, int w, int64_t label,
                  double mean_tolerance = 0, int max_tolerance = 0) {
  std::vector<float> x(static_cast<size_t>(3) * h * w);
  const ReadResult r = ds.Read(i, {0, 0, false}, x.data());
  ASSERT_TRUE(r.ok()) << i << ": " << r.error;
  EXPECT_EQ(r.label, label) << i;
  ASSERT_EQ(hwc3.size(), x.size());
  double sum = 0;
  int max = 0, exact_mismatches = 0;
  const int plane = h * w;
  for (int c = 0; c < 3; ++c) {
    for (int p = 0; p < plane; ++p) {
      const int got = static_cast<int>(std::lround(x[c * plane + p] * 255));
      const int diff = std::abs(got - hwc3[p * 3 + c]);
      sum += diff;
      max = std::max(max, diff);
      if (x[c * plane + p] != hwc3[p * 3 + c] / 255.f) ++exact_mismatches;
    }
  }
  if (mean_tolerance == 0 && max_tolerance == 0) {
    EXPECT_EQ(exact_mismatches, 0) << "sample " << i << " (max diff " << max << ")";
  } else {
    EXPECT_LE(sum / x.size(), mean_tolerance) << "sample " << i;
    EXPECT_LE(max, max_tolerance) << "sample " << i;
  }
}

Pixels Resize(const Pixels& hwc3, int h, int w, int interpolation) {
  cv::Mat out;
  cv::resize(cv::Mat(kH, kW, CV_8UC3, const_cast<uint8_t*>(hwc3.data())), out, cv::Size(w, h), 0, 0,
             interpolation);
  return Pixels(out.data, out.data + out.total() * 3);
}

class ConverterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestDir();
    images_ = std::make_unique<ImageFolderFixture>(dir_);
    folder_ = ScanImageFolder(images_->root);
    ASSERT_EQ(folder_.entries.size(), 6u);
  }

  ConvertOptions Options(const std::string& name) const {
    ConvertOptions o;
    o.from = "folder";
    o.src = images_->root;
    o.to = dir_ + "/" + name;
    return o;
  }

  std::string dir_;
  std::unique_ptr<ImageFolderFixture> images_;
  ImageFolder folder_;
};

class ConverterRoundTrip : public ConverterTest,
                           public ::testing::WithParamInterface<std::tuple<std::string, bool>> {};

TEST_P(ConverterRoundTrip, LmdbSamplesEqualTheImagesDecodedDirectly) {
  const auto [format, encoded] = GetParam();
  ConvertOptions o = Options("out.lmdb");
  o.format = format;
  o.encoded = encoded ? 1 : 0;
  std::vector<int64_t> progress;
  const ConvertSummary s = ConvertToLmdb(o, [&](int64_t done, int64_t total) {
    EXPECT_EQ(total, 6);
    progress.push_back(done);
  });
  EXPECT_EQ(s.records, 6);
  EXPECT_EQ(s.classes, 3);
  EXPECT_EQ(s.encoded, encoded);
  EXPECT_FALSE(s.reencoded);
  EXPECT_EQ(progress, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_GT(s.disk_bytes, 0u);

  // The records themselves: layout, encoding, stated shape.
  LmdbReader reader(o.to);
  ASSERT_EQ(reader.size(), 6);
  for (int64_t i = 0; i < 6; ++i) {
    const std::string& path = folder_.entries[i].path;
    const std::string_view value = reader.Get(i);
    EXPECT_EQ(RecordFormatName(DetectRecordFormat(value)), format);
    RecordView r;
    ASSERT_TRUE(DecodeRecord(value, &r).ok());
    const bool png = path.substr(path.size() - 4) == ".png";
    EXPECT_EQ(r.encoding, !encoded ? RecordEncoding::kRaw
                          : png    ? RecordEncoding::kPng
                                   : RecordEncoding::kJpeg)
        << path;
    EXPECT_EQ(r.shape, (std::vector<int64_t>{images_->channels[path], kH, kW})) << path;
  }

  auto ds = OpenLmdb(o.to, kH, kW);
  ASSERT_EQ(ds->size(), 6);
  for (int64_t i = 0; i < 6; ++i) {
    const ImageFolderEntry& e = folder_.entries[i];
    ExpectSample(*ds, i, images_->rgb[e.path], kH, kW, e.label);
  }
}

INSTANTIATE_TEST_SUITE_P(FormatsAndEncodings, ConverterRoundTrip,
                         ::testing::Combine(::testing::Values("cnnflow", "caffe"),
                                            ::testing::Bool()));

TEST_F(ConverterTest, RawResizeMatchesCvResize) {
  // Shrinking: INTER_AREA; growing: INTER_LINEAR (Caffe's convert_imageset
  // uses the latter for both).
  for (const auto& [h, w, interpolation] :
       {std::tuple{7, 5, cv::INTER_AREA}, std::tuple{16, 20, cv::INTER_LINEAR}}) {
    for (const std::string format : {"cnnflow", "caffe"}) {
      ConvertOptions o = Options(format + std::to_string(h) + ".lmdb");
      o.format = format;
      o.encoded = 0;
      o.resize_h = h;
      o.resize_w = w;
      const ConvertSummary s = ConvertToLmdb(o);
      EXPECT_FALSE(s.reencoded);
      LmdbReader reader(o.to);
      RecordView r;
      ASSERT_TRUE(DecodeRecord(reader.Get(0), &r).ok());
      EXPECT_EQ(r.shape, (std::vector<int64_t>{3, h, w}));
      auto ds = OpenLmdb(o.to, h, w);
      for (int64_t i = 0; i < 6; ++i) {
        const ImageFolderEntry& e = folder_.entries[i];
        ExpectSample(*ds, i, Resize(images_->rgb[e.path], h, w, interpolation), h, w, e.label);
      }
    }
  }
}

TEST_F(ConverterTest, EncodedResizeIsReencodedAsJpegCloseToCvResize) {
  ConvertOptions o = Options("resized.lmdb");
  o.encoded = 1;
  o.resize_h = 8;
  o.resize_w = 9;
  const ConvertSummary s = ConvertToLmdb(o);
  EXPECT_TRUE(s.encoded);
  EXPECT_TRUE(s.reencoded);
  LmdbReader reader(o.to);
  for (int64_t i = 0; i < 6; ++i) {  // PNGs too become JPEGs of the new size
    RecordView r;
    ASSERT_TRUE(DecodeRecord(reader.Get(i), &r).ok());
    EXPECT_EQ(r.encoding, RecordEncoding::kJpeg) << i;
    EXPECT_EQ(r.shape, (std::vector<int64_t>{images_->channels[folder_.entries[i].path], 8, 9}));
  }
  auto ds = OpenLmdb(o.to, 8, 9);
  for (int64_t i = 0; i < 6; ++i) {
    const ImageFolderEntry& e = folder_.entries[i];
    // JPEG loss (quality 95, 4:2:0 chroma) on smooth 8x9 images: tolerance
    // 3 grey levels mean absolute error per sample, 12 at worst (measured
    // here: mean 0.35..1.96, max 2..7).
    ExpectSample(*ds, i, Resize(images_->rgb[e.path], 8, 9, cv::INTER_AREA), 8, 9, e.label, 3.0,
                 12);
  }
}

TEST_F(ConverterTest, ShuffleAndLimitWriteTheChosenItemsInOrder) {
  ConvertOptions o = Options("shuffled.lmdb");
  o.shuffle = true;
  o.seed = 3;
  o.limit = 4;
  EXPECT_EQ(ConvertToLmdb(o).records, 4);
  const std::vector<int64_t> order = ConvertWriteOrder(6, true, 3, 4);
  ASSERT_EQ(order.size(), 4u);
  EXPECT_EQ(std::set<int64_t>(order.begin(), order.end()).size(), 4u);
  EXPECT_EQ(ConvertWriteOrder(6, true, 3, -1).size(), 6u);
  EXPECT_EQ(ConvertWriteOrder(6, false, 3, -1), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_NE(ConvertWriteOrder(6, true, 3, -1), ConvertWriteOrder(6, false, 3, -1));
  auto ds = OpenLmdb(o.to, kH, kW);
  ASSERT_EQ(ds->size(), 4);
  for (int64_t k = 0; k < 4; ++k) {
    const ImageFolderEntry& e = folder_.entries[order[k]];
    ExpectSample(*ds, k, images_->rgb[e.path], kH, kW, e.label);
  }
}

void WriteIdx(const std::string& path, uint32_t magic, const std::vector<uint32_t>& dims,
              const Pixels& data) {
  std::string bytes;
  auto be32 = [&](uint32_t v) {
    for (int i = 3; i >= 0; --i) bytes.push_back(static_cast<char>(v >> (8 * i)));
  };
  be32(magic);
  for (uint32_t d : dims) be32(d);
  bytes.append(data.begin(), data.end());
  WriteFile(path, bytes);
}

TEST_F(ConverterTest, IdxRawAndResized) {
  const int n = 3, rows = 6, cols = 8;
  Pixels images(n * rows * cols);
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<uint8_t>(i * 5 + i / 9);
  WriteIdx(dir_ + "/images.idx", 0x803, {n, rows, cols}, images);
  WriteIdx(dir_ + "/labels.idx", 0x801, {n}, {2, 0, 1});
  for (const int resize : {0, 1}) {
    ConvertOptions o;
    o.from = "idx";
    o.src = dir_ + "/images.idx";
    o.labels = dir_ + "/labels.idx";
    o.to = dir_ + "/idx" + std::to_string(resize) + ".lmdb";
    o.format = resize ? "caffe" : "cnnflow";
    if (resize) {
      o.resize_h = 4;
      o.resize_w = 5;
    }
    const ConvertSummary s = ConvertToLmdb(o);
    EXPECT_EQ(s.records, n);
    EXPECT_EQ(s.classes, 3);
    EXPECT_FALSE(s.encoded);
    LmdbReader reader(o.to);
    for (int i = 0; i < n; ++i) {
      RecordView r;
      ASSERT_TRUE(DecodeRecord(reader.Get(i), &r).ok());
      EXPECT_EQ(r.label, std::vector<int64_t>({2, 0, 1})[i]);
      EXPECT_EQ(r.encoding, RecordEncoding::kRaw);
      Pixels expected(images.begin() + i * rows * cols, images.begin() + (i + 1) * rows * cols);
      if (resize) {
        cv::Mat out;
        cv::resize(cv::Mat(rows, cols, CV_8UC1, expected.data()), out, cv::Size(5, 4), 0, 0,
                   cv::INTER_AREA);
        expected.assign(out.data, out.data + out.total());
      }
      EXPECT_EQ(r.shape, (std::vector<int64_t>{1, resize ? 4 : rows, resize ? 5 : cols}));
      EXPECT_EQ(Pixels(r.data, r.data + r.size), expected) << i;
    }
  }
}

TEST_F(ConverterTest, BadInputIsAnErrorNamingTheFileAndLeavesNoOutput) {
  const std::string bad = images_->root + "/b/9.png";
  const std::string png = testing::WritePng(kW, kH, PNG_COLOR_TYPE_GRAY, 8, Smooth(1, 9));
  WriteFile(bad, png.substr(0, png.size() / 2));
  for (const int encoded : {0, 1}) {
    ConvertOptions o = Options("bad.lmdb");
    o.encoded = encoded;
    try {
      ConvertToLmdb(o);
      if (encoded == 0) ADD_FAILURE() << "a truncated PNG was converted to raw pixels";
    } catch (const Error& e) {
      // Raw conversion decodes, so it finds the damage; encoded keeps the
      // bytes (the header is intact) and leaves it to the loader.
      EXPECT_EQ(encoded, 0) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("truncated PNG"), std::string::npos) << e.what();
      EXPECT_FALSE(fs::exists(o.to));
      EXPECT_FALSE(fs::exists(o.to + ".tmp"));
    }
    if (encoded == 1) {
      EXPECT_TRUE(fs::exists(o.to));
    }
  }
  // Not an image at all: even encoded conversion reads the header.
  WriteFile(images_->root + "/a/x.jpg", "plain text, not a JPEG");
  ConvertOptions o = Options("bad2.lmdb");
  try {
    ConvertToLmdb(o);
    ADD_FAILURE() << "a text file was converted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(images_->root + "/a/x.jpg"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("unknown image format"), std::string::npos) << e.what();
  }
  // An existing output without overwrite.
  o = Options("bad.lmdb");
  try {
    ConvertToLmdb(o);
    ADD_FAILURE() << "an existing LMDB was replaced without overwrite";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos) << e.what();
  }
}

TEST(ConvertOptionsTest, BadOptionsAreConfigErrors) {
  auto check = [](ConvertOptions o, const std::string& expected) {
    try {
      ValidateConvertOptions(&o);
      ADD_FAILURE() << "accepted; expected: " << expected;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  ConvertOptions o;
  o.from = "folder";
  o.src = "x";
  o.to = "y";
  ConvertOptions ok = o;
  ValidateConvertOptions(&ok);
  EXPECT_EQ(ok.encoded, 1);  // the folder default
  ConvertOptions bad = o;
  bad.resize_h = 5;
  check(bad, "--resize");
  bad = o;
  bad.format = "tfrecord";
  check(bad, "--format");
  bad = o;
  bad.from = "idx";
  bad.labels = "l";
  bad.encoded = 1;
  check(bad, "--encoded applies to image folders only");
  bad = o;
  bad.from = "csv";
  check(bad, "--from must be folder, idx, ts or wav");
}

}  // namespace
}  // namespace cnnflow
