// The 1D sources: FitSeries (pad / crop / resample / standardize) against
// values worked out by hand, random crops keyed by (seed, epoch, sample),
// the `ts` and `wav` sources through the registry on files written here
// (FSDD-style names, select / label regexes), and ts / wav -> LMDB (the
// converter) -> `lmdb` source giving the same samples as the direct source.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "loaders/converter.h"
#include "loaders/lmdb_store.h"
#include "loaders/record.h"
#include "loaders/series_fit.h"
#include "loaders/source_registry.h"
#include "loaders/ts_dataset.h"
#include "loaders/wav_dataset.h"
#include "ops/error.h"
#include "tests/testing/open_source.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;
using Floats = std::vector<float>;

const ReadContext kEval{7, 0, false};

Floats Fit(const Floats& src, int64_t channels, int64_t length, SeriesFit fit,
           bool standardize = false, const ReadContext& ctx = kEval, int64_t index = 0) {
  SeriesOptions o;
  o.length = length;
  o.fit = fit;
  o.standardize = standardize;
  Floats dst(static_cast<size_t>(channels * length), -99.f);
  FitSeries(src.data(), channels, static_cast<int64_t>(src.size()) / channels, o, ctx, index,
            dst.data());
  return dst;
}

std::shared_ptr<Dataset> Open(const std::string& type,
                              const std::map<std::string, ParamValue>& values) {
  return testing::OpenSource(type, values);
}

Floats ReadSample(const Dataset& ds, int64_t i, const ReadContext& ctx, int64_t* label = nullptr) {
  Floats x(static_cast<size_t>(ds.sample_shape().numel()), -99.f);
  const ReadResult r = ds.Read(i, ctx, x.data());
  EXPECT_TRUE(r.ok()) << i << ": " << r.error;
  if (label) *label = r.label;
  return x;
}

TEST(FitSeriesTest, PadAppendsZerosOrKeepsTheStart) {
  // Two channels of 3 values -> 5: zeros at the end of each channel.
  EXPECT_EQ(Fit({1, 2, 3, 4, 5, 6}, 2, 5, SeriesFit::kPad), (Floats{1, 2, 3, 0, 0, 4, 5, 6, 0, 0}));
  // Longer: the first values.
  EXPECT_EQ(Fit({1, 2, 3, 4, 5, 6}, 2, 2, SeriesFit::kPad), (Floats{1, 2, 4, 5}));
  // An empty series is all zeros.
  EXPECT_EQ(Fit({}, 1, 3, SeriesFit::kPad), (Floats{0, 0, 0}));
}

TEST(FitSeriesTest, CropIsCentredInEvaluationAndPadsShortSeries) {
  // 7 values -> 3: offset (7 - 3) / 2 = 2 in both channels.
  EXPECT_EQ(Fit({0, 1, 2, 3, 4, 5, 6, 10, 11, 12, 13, 14, 15, 16}, 2, 3, SeriesFit::kCrop),
            (Floats{2, 3, 4, 12, 13, 14}));
  // 6 -> 3: offset 1 (floor of 1.5).
  EXPECT_EQ(Fit({0, 1, 2, 3, 4, 5}, 1, 3, SeriesFit::kCrop), (Floats{1, 2, 3}));
  EXPECT_EQ(Fit({1, 2}, 1, 4, SeriesFit::kCrop), (Floats{1, 2, 0, 0}));
}

TEST(FitSeriesTest, ResampleIsLinearAndKeepsTheEnds) {
  EXPECT_EQ(Fit({0, 10}, 1, 3, SeriesFit::kResample), (Floats{0, 5, 10}));
  EXPECT_EQ(Fit({0, 1, 2, 3, 4}, 1, 3, SeriesFit::kResample), (Floats{0, 2, 4}));
  // 4 -> 7 points: positions 0, .5, 1, ..., 3 of [0, 2, 4, 8] and of [1, 1, 1, 1].
  EXPECT_EQ(Fit({0, 2, 4, 8, 1, 1, 1, 1}, 2, 7, SeriesFit::kResample),
            (Floats{0, 1, 2, 3, 4, 6, 8, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(Fit({5}, 1, 3, SeriesFit::kResample), (Floats{5, 5, 5}));
}

TEST(FitSeriesTest, StandardizeZNormalisesEachChannelBeforeFitting) {
  // Channel 0: 1..4 (mean 2.5, population sd sqrt(1.25)); channel 1 constant.
  const Floats x = Fit({1, 2, 3, 4, 7, 7, 7, 7}, 2, 6, SeriesFit::kPad, true);
  const double sd = std::sqrt(1.25);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(x[i], (i + 1 - 2.5) / sd, 1e-6) << i;
  EXPECT_EQ(x[4], 0.f);  // padding: 0 = the channel's mean
  EXPECT_EQ(x[5], 0.f);
  for (int i = 6; i < 12; ++i) EXPECT_EQ(x[i], 0.f) << i;  // a constant channel: mean removed
  // Statistics come from the whole series, not the crop: the centre window
  // [2, 3] of 1..4 keeps its values' z-scores.
  const Floats c = Fit({1, 2, 3, 4}, 1, 2, SeriesFit::kCrop, true);
  EXPECT_NEAR(c[0], -0.5 / sd, 1e-6);
  EXPECT_NEAR(c[1], 0.5 / sd, 1e-6);
}

TEST(FitSeriesTest, RandomCropIsKeyedBySeedEpochAndSample) {
  Floats src(20);
  for (int i = 0; i < 20; ++i) src[i] = static_cast<float>(i);
  auto crop = [&](uint64_t seed, int64_t epoch, int64_t index) {
    return Fit(src, 1, 5, SeriesFit::kCrop, false, ReadContext{seed, epoch, true}, index);
  };
  std::set<float> starts;
  std::set<std::vector<float>> by_sample;
  for (int64_t epoch = 0; epoch < 200; ++epoch) {
    const Floats a = crop(3, epoch, 4);
    EXPECT_EQ(a, crop(3, epoch, 4)) << "the same key must give the same crop";
    // A window of consecutive source values inside the series.
    for (int i = 1; i < 5; ++i) ASSERT_EQ(a[i], a[0] + i);
    EXPECT_EQ(SeriesCropOffset(20, 5, ReadContext{3, epoch, true}, 4), static_cast<int64_t>(a[0]));
    starts.insert(a[0]);
  }
  // Offsets 0..15 all occur over 200 epochs (each has p = 1/16).
  EXPECT_EQ(starts.size(), 16u);
  EXPECT_EQ(*starts.begin(), 0.f);
  EXPECT_EQ(*starts.rbegin(), 15.f);
  for (int64_t index = 0; index < 20; ++index) by_sample.insert(crop(3, 0, index));
  EXPECT_GT(by_sample.size(), 5u) << "samples of one epoch should get different crops";
  int seed_differs = 0;
  for (int64_t index = 0; index < 20; ++index)
    seed_differs += crop(3, 0, index) != crop(4, 0, index);
  EXPECT_GT(seed_differs, 5);
  // Evaluation: always the centre.
  EXPECT_EQ(SeriesCropOffset(20, 5, ReadContext{3, 9, false}, 4), 7);
}

// ---- ts source ----

const char* kTs =
    "@problemName T\n@univariate false\n@dimensions 2\n@classLabel true up down\n@data\n"
    "1,2,3:4,5,6:down\n"
    "1,2,3,4,5,6,7:8,9,10,11,12,13,14:up\n"
    "0,10:20,30:down";

TEST(TsSourceTest, ShapesAndValuesForEachFit) {
  const std::string path = testing::TestDir() + "/t.ts";
  testing::WriteBytes(path, kTs);
  auto pad = Open("ts", {{"path", path}});
  EXPECT_EQ(pad->sample_shape(), (Shape{2, 7}));  // the longest series
  EXPECT_EQ(pad->num_classes(), 2);
  ASSERT_EQ(pad->size(), 3);
  int64_t label = -1;
  EXPECT_EQ(ReadSample(*pad, 0, kEval, &label), (Floats{1, 2, 3, 0, 0, 0, 0, 4, 5, 6, 0, 0, 0, 0}));
  EXPECT_EQ(label, 1);
  ReadSample(*pad, 1, kEval, &label);
  EXPECT_EQ(label, 0);

  auto crop = Open("ts", {{"path", path}, {"length", int64_t{3}}, {"fit", std::string("crop")}});
  EXPECT_EQ(crop->sample_shape(), (Shape{2, 3}));
  EXPECT_EQ(ReadSample(*crop, 1, kEval), (Floats{3, 4, 5, 10, 11, 12}));
  EXPECT_EQ(ReadSample(*crop, 2, kEval), (Floats{0, 10, 0, 20, 30, 0}));

  auto resample =
      Open("ts", {{"path", path}, {"length", int64_t{4}}, {"fit", std::string("resample")}});
  EXPECT_EQ(ReadSample(*resample, 1, kEval), (Floats{1, 3, 5, 7, 8, 10, 12, 14}));
  const Floats r0 = ReadSample(*resample, 0, kEval);  // positions 0, 2/3, 4/3, 2 of 1 2 3 | 4 5 6
  const Floats want = {1, 1 + 2.f / 3, 1 + 4.f / 3, 3, 4, 4 + 2.f / 3, 4 + 4.f / 3, 6};
  ASSERT_EQ(r0.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(r0[i], want[i], 1e-6) << i;

  auto z = Open("ts", {{"path", path}, {"standardize", std::string("per_sample")}});
  const Floats s = ReadSample(*z, 2, kEval);
  EXPECT_EQ(s, (Floats{-1, 1, 0, 0, 0, 0, 0, -1, 1, 0, 0, 0, 0, 0}));

  EXPECT_THROW(Open("ts", {{"path", path}, {"num_classes", int64_t{1}}}), ConfigError);
  EXPECT_THROW(Open("ts", {{"path", path}, {"fit", std::string("stretch")}}), ConfigError);
}

TEST(TsSourceTest, RealBasicMotions) {
  std::string path;
  for (const char* p :
       {"../shared/data/ucr/BasicMotions_TEST.ts", "/work/shared/data/ucr/BasicMotions_TEST.ts"}) {
    if (fs::exists(p)) path = p;
  }
  if (path.empty()) GTEST_SKIP() << "BasicMotions_TEST.ts not found";
  auto ds = Open("ts", {{"path", path}});
  EXPECT_EQ(ds->size(), 40);
  EXPECT_EQ(ds->sample_shape(), (Shape{6, 100}));
  EXPECT_EQ(ds->num_classes(), 4);
}

// ---- wav source ----

std::string WavBytes(const std::vector<int16_t>& v) {
  auto put = [](std::string* s, uint32_t x, int n) {
    for (int i = 0; i < n; ++i) s->push_back(static_cast<char>((x >> (8 * i)) & 0xff));
  };
  std::string s = "RIFF";
  put(&s, static_cast<uint32_t>(36 + 2 * v.size()), 4);
  s += "WAVEfmt ";
  put(&s, 16, 4);
  put(&s, 1, 2);
  put(&s, 1, 2);
  put(&s, 8000, 4);
  put(&s, 16000, 4);
  put(&s, 2, 2);
  put(&s, 16, 2);
  s += "data";
  put(&s, static_cast<uint32_t>(2 * v.size()), 4);
  for (int16_t x : v) put(&s, static_cast<uint16_t>(x), 2);
  return s;
}

// FSDD-style names {digit}_{speaker}_{n}.wav: digits 2, 9 and 10 (sorted as
// numbers: 10 last), speakers a and b, n = 0..6 and 12; file k holds
// samples k*100 + 0..len-1 with len = 3..8 varying.
struct WavFixture {
  std::string root;
  std::map<std::string, std::vector<int16_t>> samples;  // file name -> samples
  explicit WavFixture(const std::string& dir) : root(dir + "/recordings") {
    fs::create_directories(root);
    int k = 0;
    for (const char* digit : {"2", "9", "10"}) {
      for (const char* speaker : {"a", "b"}) {
        for (int n : {0, 1, 2, 3, 4, 5, 6, 12}) {
          const std::string name = StrCat(digit, "_", speaker, "_", n, ".wav");
          std::vector<int16_t> v(static_cast<size_t>(3 + k % 6));
          for (size_t i = 0; i < v.size(); ++i)
            v[i] = static_cast<int16_t>(k * 100 + static_cast<int>(i) - 1000);
          testing::WriteBytes(root + "/" + name, WavBytes(v));
          samples[name] = v;
          ++k;
        }
      }
    }
    testing::WriteBytes(root + "/README.txt", "not audio");  // ignored: not .wav
  }
};

const std::string kTestSelect = "_[0-4]\\.wav$";
const std::string kTrainSelect = "_([5-9]|[1-9][0-9]+)\\.wav$";

TEST(WavSourceTest, SplitsClassesAndSamples) {
  const WavFixture fx(testing::TestDir());
  const std::string label_regex = "^(\\d+)_";
  auto test = Open("wav", {{"path", fx.root},
                           {"label_regex", label_regex},
                           {"select", kTestSelect},
                           {"length", int64_t{6}}});
  auto train = Open("wav", {{"path", fx.root},
                            {"label_regex", label_regex},
                            {"select", kTrainSelect},
                            {"length", int64_t{6}}});
  EXPECT_EQ(test->size(), 3 * 2 * 5);
  EXPECT_EQ(train->size(), 3 * 2 * 3);
  EXPECT_EQ(test->sample_shape(), (Shape{1, 6}));
  EXPECT_EQ(test->num_classes(), 3);
  const auto& wt = dynamic_cast<const WavDataset&>(*test);
  EXPECT_EQ(wt.folder().classes, (std::vector<std::string>{"2", "9", "10"}));
  std::set<std::string> seen;
  for (const Dataset* ds : {test.get(), train.get()}) {
    const bool is_test = ds == test.get();
    for (int64_t i = 0; i < ds->size(); ++i) {
      const std::string name = fs::path(ds->Key(i)).filename().string();
      EXPECT_TRUE(seen.insert(name).second) << name << " in both splits";
      const char n = name[name.size() - 5];
      EXPECT_EQ(is_test, n >= '0' && n <= '4' && name[name.size() - 6] == '_') << name;
      int64_t label = -1;
      const Floats x = ReadSample(*ds, i, kEval, &label);
      EXPECT_EQ(label, name[0] == '2' ? 0 : name[0] == '9' ? 1 : 2) << name;
      // Crop (the wav default): centre window of 6, zeros after a short file.
      const std::vector<int16_t>& v = fx.samples.at(name);
      const size_t off = v.size() > 6 ? (v.size() - 6) / 2 : 0;
      for (size_t j = 0; j < 6; ++j) {
        const float want = off + j < v.size() ? v[off + j] / 32768.f : 0.f;
        EXPECT_EQ(x[j], want) << name << " " << j;
      }
    }
  }
  EXPECT_EQ(seen.size(), fx.samples.size());
  // length 0: the longest file (8 samples).
  EXPECT_EQ(Open("wav", {{"path", fx.root}})->sample_shape(), (Shape{1, 8}));
}

TEST(WavSourceTest, ClassNamesSortByNameUnlessAllIntegers) {
  const WavFixture fx(testing::TestDir());
  // Speakers as classes: "a" < "b".
  auto ds = Open(
      "wav",
      {{"path", fx.root}, {"label_regex", std::string("^\\d+_([a-z]+)_")}, {"length", int64_t{4}}});
  EXPECT_EQ(dynamic_cast<const WavDataset&>(*ds).folder().classes,
            (std::vector<std::string>{"a", "b"}));
  // A whole match without a capture group; "10_" < "2_" < "9_" by name.
  ds = Open("wav",
            {{"path", fx.root}, {"label_regex", std::string("^\\d+_")}, {"length", int64_t{4}}});
  EXPECT_EQ(dynamic_cast<const WavDataset&>(*ds).folder().classes,
            (std::vector<std::string>{"10_", "2_", "9_"}));
}

TEST(WavSourceTest, BadSettingsAndFiles) {
  const WavFixture fx(testing::TestDir());
  EXPECT_THROW(Open("wav", {{"path", fx.root}, {"select", std::string("_99\\.wav$")}}),
               ConfigError);
  EXPECT_THROW(Open("wav", {{"path", fx.root}, {"select", std::string("([")}}), ConfigError);
  EXPECT_THROW(Open("wav", {{"path", fx.root}, {"label_regex", std::string("(")}}), ConfigError);
  try {
    Open("wav", {{"path", fx.root}, {"label_regex", std::string("^9_")}});
    ADD_FAILURE() << "a file the label regex does not match was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("10_a_0.wav"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Open("wav", {{"path", fx.root + "/absent"}}), Error);
  // A corrupt file is a ReadResult error naming it, not an exception.
  testing::WriteBytes(fx.root + "/9_b_3.wav", std::string("RIFF\x10\0\0\0WAVEjunk", 16));
  auto ds = Open("wav", {{"path", fx.root}, {"length", int64_t{4}}});
  Floats x(4);
  int bad = 0;
  for (int64_t i = 0; i < ds->size(); ++i) {
    const ReadResult r = ds->Read(i, kEval, x.data());
    if (!r.ok()) {
      ++bad;
      EXPECT_NE(r.error.find("9_b_3.wav"), std::string::npos) << r.error;
    }
  }
  EXPECT_EQ(bad, 1);
}

// ---- ts / wav -> LMDB -> lmdb source ----

// Every sample of `lmdb` equals `direct`'s, in evaluation and in training
// passes (random crops included), with the same labels.
void ExpectSameSamples(const Dataset& direct, const Dataset& lmdb) {
  ASSERT_EQ(lmdb.size(), direct.size());
  EXPECT_EQ(lmdb.sample_shape(), direct.sample_shape());
  for (const ReadContext& ctx :
       {ReadContext{5, 0, false}, ReadContext{5, 1, true}, ReadContext{6, 2, true}}) {
    for (int64_t i = 0; i < direct.size(); ++i) {
      int64_t a = -1, b = -2;
      EXPECT_EQ(ReadSample(lmdb, i, ctx, &b), ReadSample(direct, i, ctx, &a)) << "sample " << i;
      EXPECT_EQ(a, b) << "sample " << i;
    }
  }
}

TEST(SeriesLmdbTest, TsToLmdbGivesTheSameSamples) {
  const std::string dir = testing::TestDir();
  const std::string path = dir + "/t.ts";
  testing::WriteBytes(path, kTs);
  ConvertOptions o;
  o.from = "ts";
  o.src = path;
  o.to = dir + "/t.lmdb";
  const ConvertSummary s = ConvertToLmdb(o);
  EXPECT_EQ(s.records, 3);
  EXPECT_EQ(s.classes, 2);
  {
    LmdbReader reader(o.to);  // f32 [C, L] records at each case's own length
    RecordView r;
    ASSERT_TRUE(DecodeRecord(reader.Get(1), &r).ok());
    EXPECT_EQ(r.dtype, RecordDType::kF32);
    EXPECT_EQ(r.encoding, RecordEncoding::kRaw);
    EXPECT_EQ(r.shape, (std::vector<int64_t>{2, 7}));
    EXPECT_EQ(r.label, 0);
    ASSERT_TRUE(DecodeRecord(reader.Get(2), &r).ok());
    EXPECT_EQ(r.shape, (std::vector<int64_t>{2, 2}));
  }
  for (const std::string fit : {"pad", "crop", "resample"}) {
    for (const std::string z : {"none", "per_sample"}) {
      SCOPED_TRACE(fit + " " + z);
      const int64_t length = fit == "pad" ? 0 : 4;
      auto direct =
          Open("ts", {{"path", path}, {"length", length}, {"fit", fit}, {"standardize", z}});
      std::map<std::string, ParamValue> lv = {{"path", o.to}, {"fit", fit}, {"standardize", z}};
      if (length) lv["shape"] = std::vector<int64_t>{2, length};
      auto lmdb = Open("lmdb", lv);
      EXPECT_EQ(lmdb->num_classes(), 2);
      ExpectSameSamples(*direct, *lmdb);
    }
  }
  // Image settings on series records, and series records in an image data set.
  auto as_image = Open("lmdb", {{"path", o.to}, {"shape", std::vector<int64_t>{1, 2, 7}}});
  Floats x(14);
  const ReadResult r = as_image->Read(0, kEval, x.data());
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.error.find("series"), std::string::npos) << r.error;
}

TEST(SeriesLmdbTest, WavToLmdbGivesTheSameSamples) {
  const std::string dir = testing::TestDir();
  const WavFixture fx(dir);
  ConvertOptions o;
  o.from = "wav";
  o.src = fx.root;
  o.to = dir + "/train.lmdb";
  o.label_regex = "^(\\d+)_";
  o.select = kTrainSelect;
  const ConvertSummary s = ConvertToLmdb(o);
  EXPECT_EQ(s.records, 18);
  EXPECT_EQ(s.classes, 3);
  auto direct = Open("wav", {{"path", fx.root},
                             {"label_regex", o.label_regex},
                             {"select", kTrainSelect},
                             {"length", int64_t{5}}});
  auto lmdb =
      Open("lmdb",
           {{"path", o.to}, {"shape", std::vector<int64_t>{1, 5}}, {"fit", std::string("crop")}});
  ExpectSameSamples(*direct, *lmdb);
  // Without a shape: [1, the longest record].
  EXPECT_EQ(Open("lmdb", {{"path", o.to}})->sample_shape(), (Shape{1, 8}));
}

TEST(SeriesLmdbTest, SeriesConversionOptions) {
  auto check = [](ConvertOptions o, const std::string& expected) {
    try {
      ConvertToLmdb(o);
      ADD_FAILURE() << "accepted; expected: " << expected;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  ConvertOptions o;
  o.from = "ts";
  o.src = "x.ts";
  o.to = testing::TestDir() + "/out.lmdb";
  ConvertOptions bad = o;
  bad.format = "caffe";
  check(bad, "a Caffe Datum holds images");
  bad = o;
  bad.encoded = 1;
  check(bad, "--encoded applies to image folders only");
  bad = o;
  bad.resize_h = bad.resize_w = 8;
  check(bad, "--resize applies to images only");
  bad = o;
  bad.select = "_1";
  check(bad, "apply to --from wav only");
  EXPECT_FALSE(fs::exists(o.to));
}

}  // namespace
}  // namespace cnnflow
