// The lmdb source end to end: LMDB values -> record decoding -> TurboJPEG ->
// augmentation, with bad records reported as values.
#include "loaders/lmdb_dataset.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "loaders/jpeg_decoder.h"
#include "loaders/lmdb_store.h"
#include "loaders/record.h"
#include "loaders/source_registry.h"
#include "loaders/transform.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

constexpr int kSide = 8;

std::vector<uint8_t> Image(int seed) {  // HWC RGB
  std::vector<uint8_t> px(kSide * kSide * 3);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>((i * 7 + seed * 31) % 256);
  return px;
}

RecordView Jpeg(const std::string& bytes, int64_t label) {
  RecordView v;
  v.label = label;
  v.shape = {3, kSide, kSide};
  v.encoding = RecordEncoding::kJpeg;
  v.dtype = RecordDType::kU8;
  v.data = reinterpret_cast<const uint8_t*>(bytes.data());
  v.size = bytes.size();
  return v;
}

class LmdbDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = testing::TestDir() + "/data.lmdb";
    LmdbWriter writer(path_);
    int64_t key = 0;
    auto put = [&](const std::string& value) { writer.Put(LmdbWriter::IndexKey(key++), value); };
    for (int i = 0; i < 4; ++i) {  // 0-3: good JPEGs, label i
      jpegs_.push_back(EncodeJpeg(Image(i).data(), kSide, kSide, 3, 95));
      put(EncodeCnnflowRecord(Jpeg(jpegs_.back(), i)));
    }
    const std::string cut = jpegs_[0].substr(0, jpegs_[0].size() / 2);
    put(EncodeCnnflowRecord(Jpeg(cut, 1)));        // 4: truncated JPEG
    put("CFR1xy");                                 // 5: a short value
    put(EncodeCnnflowRecord(Jpeg(jpegs_[1], 9)));  // 6: label out of range
    raw_ = Image(5);                               // 7: raw CHW uint8, label 2
    std::vector<uint8_t> chw(raw_.size());
    for (int c = 0; c < 3; ++c)
      for (int p = 0; p < kSide * kSide; ++p) chw[c * kSide * kSide + p] = raw_[p * 3 + c];
    RecordView v;
    v.label = 2;
    v.shape = {3, kSide, kSide};
    v.data = chw.data();
    v.size = chw.size();
    put(EncodeCnnflowRecord(v));
    writer.Finish();
  }

  std::shared_ptr<Dataset> Open(bool augment) {
    const SourceType* type = SourceRegistry::Get().Find("lmdb");
    EXPECT_NE(type, nullptr);
    Args a;
    a.Set("path", path_);
    a.Set("num_classes", int64_t{4});
    a.Set("shape", std::vector<int64_t>{3, kSide, kSide});
    if (augment) {
      a.Set("pad", int64_t{2});
      a.Set("random_crop", true);
      a.Set("hflip", true);
    }
    a.FillDefaults(type->schema);
    return type->open(a);
  }

  std::string path_;
  std::vector<std::string> jpegs_;
  std::vector<uint8_t> raw_;
};

TEST_F(LmdbDatasetTest, GoodRecordsDecodeToTheImages) {
  auto ds = Open(false);
  EXPECT_EQ(ds->size(), 8);
  EXPECT_EQ(ds->num_classes(), 4);
  EXPECT_EQ(ds->sample_shape(), Shape({3, kSide, kSide}));
  EXPECT_EQ(ds->Key(3), "00000003");
  std::vector<float> x(3 * kSide * kSide);
  std::vector<uint8_t> hwc(kSide * kSide * 3);
  for (int i = 0; i < 4; ++i) {
    const ReadResult r = ds->Read(i, {1, 0, false}, x.data());
    ASSERT_TRUE(r.ok()) << r.error;
    EXPECT_EQ(r.label, i);
    JpegDecoder dec;
    ASSERT_TRUE(dec.Decode(reinterpret_cast<const uint8_t*>(jpegs_[i].data()), jpegs_[i].size(), 3,
                           hwc.data(), hwc.size())
                    .ok());
    for (int c = 0; c < 3; ++c)
      for (int p = 0; p < kSide * kSide; ++p)
        ASSERT_FLOAT_EQ(x[c * kSide * kSide + p], hwc[p * 3 + c] / 255.f) << i;
  }
  const ReadResult r = ds->Read(7, {1, 0, false}, x.data());  // raw CHW record
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.label, 2);
  for (int c = 0; c < 3; ++c)
    for (int p = 0; p < kSide * kSide; ++p)
      ASSERT_FLOAT_EQ(x[c * kSide * kSide + p], raw_[p * 3 + c] / 255.f);
}

TEST_F(LmdbDatasetTest, BadRecordsAreErrorValues) {
  auto ds = Open(false);
  std::vector<float> x(3 * kSide * kSide);
  EXPECT_EQ(ds->Read(4, {}, x.data()).error.rfind("corrupt JPEG", 0), 0u)
      << ds->Read(4, {}, x.data()).error;
  EXPECT_NE(ds->Read(5, {}, x.data()).error.find("value is 6 bytes, the header needs 24"),
            std::string::npos)
      << ds->Read(5, {}, x.data()).error;
  EXPECT_EQ(ds->Read(6, {}, x.data()).error, "label 9 out of range [0, 4)");
}

TEST_F(LmdbDatasetTest, AugmentationIsSeededBySeedEpochAndSampleOnlyInTraining) {
  auto ds = Open(true);
  const size_t n = 3 * kSide * kSide;
  std::vector<float> a(n), b(n), eval(n), plain(n);
  ASSERT_TRUE(ds->Read(2, {7, 3, true}, a.data()).ok());
  ASSERT_TRUE(ds->Read(2, {7, 3, true}, b.data()).ok());
  EXPECT_EQ(a, b);
  int differ = 0;
  for (int epoch = 0; epoch < 8; ++epoch) {
    ASSERT_TRUE(ds->Read(2, {7, epoch, true}, b.data()).ok());
    differ += b != a;
  }
  EXPECT_GE(differ, 4) << "pad 2 + crop + flip should change most epochs";
  // Evaluation passes do not augment: the plain decode.
  ASSERT_TRUE(ds->Read(2, {7, 3, false}, eval.data()).ok());
  ASSERT_TRUE(Open(false)->Read(2, {0, 0, false}, plain.data()).ok());
  EXPECT_EQ(eval, plain);
}

}  // namespace
}  // namespace cnnflow

namespace cnnflow {
namespace {

// FuseNormalize: the source writes normalised samples, bitwise what the
// transform makes of an unfused read, for JPEG and raw records, train
// (padded, cropped, flipped) and eval; mean/std that do not fit the
// channels stay the transform's.
TEST_F(LmdbDatasetTest, FusedNormalisationIsTheTransformBitwise) {
  const std::vector<double> mean{0.4914, 0.4822, 0.4465}, stdev{0.2470, 0.2435, 0.2616};
  SampleTransform transform;
  transform.AddNormalize(mean, stdev);
  auto plain = Open(true), fused = Open(true);
  EXPECT_FALSE(fused->normalizes());
  EXPECT_TRUE(fused->FuseNormalize(mean, stdev));
  EXPECT_TRUE(fused->normalizes());
  const Shape shape{3, kSide, kSide};
  std::vector<float> a(shape.numel()), b(shape.numel());
  for (int64_t i : {0, 1, 2, 3, 7}) {
    for (bool train : {true, false}) {
      for (int64_t epoch = 0; epoch < 4; ++epoch) {
        const ReadContext ctx{7, epoch, train};
        ASSERT_TRUE(plain->Read(i, ctx, a.data()).ok());
        transform.Apply(a.data(), shape);
        ASSERT_TRUE(fused->Read(i, ctx, b.data()).ok());
        ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
            << "record " << i << (train ? " train" : " eval") << " epoch " << epoch;
      }
    }
  }
  auto two = Open(false);
  EXPECT_FALSE(two->FuseNormalize({0.5, 0.5}, {0.2, 0.2}));
  EXPECT_FALSE(two->normalizes());
}

}  // namespace
}  // namespace cnnflow
