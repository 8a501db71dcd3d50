// The `synthetic` source: shapes, labels, determinism across calls and
// threads, the class-mean signal, and errors naming the bad parameter.
#include "loaders/synthetic_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "loaders/source_registry.h"
#include "ops/error.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

using Floats = std::vector<float>;
using Params = std::map<std::string, ParamValue>;

// Opens the source the way a config does: by name, defaults filled in.
std::shared_ptr<Dataset> Open(const Params& values) {
  const SourceType* t = SourceRegistry::Get().Find("synthetic");
  EXPECT_NE(t, nullptr) << "source 'synthetic' is not registered";
  if (t == nullptr) return nullptr;
  Args a;
  for (const auto& [k, v] : values) a.Set(k, v);
  a.FillDefaults(t->schema);
  return t->open(a);
}

std::string OpenError(const Params& values) {
  return testing::ErrorOf([&] { Open(values); });
}

Floats ReadSample(const Dataset& ds, int64_t i, const ReadContext& ctx = {},
                  int64_t* label = nullptr) {
  Floats x(static_cast<size_t>(ds.sample_shape().numel()), std::nanf(""));
  const ReadResult r = ds.Read(i, ctx, x.data());
  EXPECT_TRUE(r.ok()) << i << ": " << r.error;
  if (label) *label = r.label;
  return x;
}

// The documented class mean: separation * (2 ((k + c) mod K) + 1 - K) / K.
double DocumentedMean(double separation, int64_t k, int64_t c, int64_t classes) {
  return separation * static_cast<double>(2 * ((k + c) % classes) + 1 - classes) /
         static_cast<double>(classes);
}

TEST(SyntheticDataset, ShapesSizeAndClassesAreTheParameters) {
  auto img = Open({{"shape", std::vector<int64_t>{3, 32, 32}},
                   {"classes", int64_t{7}},
                   {"size", int64_t{123}}});
  EXPECT_EQ(img->sample_shape(), Shape({3, 32, 32}));
  EXPECT_EQ(img->size(), 123);
  EXPECT_EQ(img->num_classes(), 7);
  EXPECT_NE(img->description().find("synthetic"), std::string::npos) << img->description();

  auto series = Open({{"shape", std::vector<int64_t>{6, 100}}});
  EXPECT_EQ(series->sample_shape(), Shape({6, 100}));
  EXPECT_EQ(series->num_classes(), 10);  // the default
  EXPECT_EQ(series->size(), 50000);
}

TEST(SyntheticDataset, EveryValueIsWrittenAndBounded) {
  // An odd number of values: the last one must be written too.
  for (const auto& shape :
       {std::vector<int64_t>{1, 7}, std::vector<int64_t>{3, 5, 3}, std::vector<int64_t>{2, 1, 1}}) {
    auto ds = Open({{"shape", shape}, {"separation", 2.0}, {"classes", int64_t{4}}});
    for (int64_t i = 0; i < 50; ++i) {
      int64_t label = -1;
      const Floats x = ReadSample(*ds, i, {}, &label);
      const int64_t plane = static_cast<int64_t>(x.size()) / shape[0];
      for (size_t e = 0; e < x.size(); ++e) {
        ASSERT_TRUE(std::isfinite(x[e]))
            << "shape " << Shape(shape) << " sample " << i << " value " << e << " not written";
        // Noise is uniform in [-sqrt 3, sqrt 3) around the class mean.
        const double mean = DocumentedMean(2.0, label, static_cast<int64_t>(e) / plane, 4);
        EXPECT_LE(std::fabs(x[e] - mean), std::sqrt(3.0) + 1e-5) << i << " " << e;
      }
    }
  }
}

TEST(SyntheticDataset, LabelsAreInRangeAndBalanced) {
  constexpr int64_t kClasses = 10, kSize = 20000;
  auto ds = Open({{"shape", std::vector<int64_t>{1, 2}}, {"classes", kClasses}, {"size", kSize}});
  std::vector<int64_t> count(kClasses, 0);
  Floats x(2);
  for (int64_t i = 0; i < kSize; ++i) {
    const int64_t label = ds->Read(i, {}, x.data()).label;
    ASSERT_GE(label, 0) << i;
    ASSERT_LT(label, kClasses) << i;
    ++count[label];
  }
  // Expected 2000 each; binomial sd ~42, so +-10% is > 4 sd.
  for (int64_t k = 0; k < kClasses; ++k) {
    EXPECT_NEAR(count[k], kSize / kClasses, kSize / kClasses / 10) << "class " << k;
  }
  auto one = Open({{"shape", std::vector<int64_t>{1, 2}}, {"classes", int64_t{1}}});
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(one->Read(i, {}, x.data()).label, 0);
}

TEST(SyntheticDataset, SampleIsAFunctionOfSeedAndIndexOnly) {
  const Params p = {{"shape", std::vector<int64_t>{3, 8, 8}}, {"seed", int64_t{5}}};
  auto a = Open(p), b = Open(p);
  int64_t la = -1, lb = -1;
  // Same (seed, index): same sample from another instance, another epoch,
  // an evaluation pass, read after other samples.
  const Floats first = ReadSample(*a, 17, {1, 0, true}, &la);
  ReadSample(*a, 3);
  EXPECT_EQ(ReadSample(*b, 17, {99, 4, false}, &lb), first);
  EXPECT_EQ(la, lb);
  // Another index or another seed: other values.
  EXPECT_NE(ReadSample(*a, 18), first);
  auto c = Open({{"shape", std::vector<int64_t>{3, 8, 8}}, {"seed", int64_t{6}}});
  EXPECT_NE(ReadSample(*c, 17), first);
  // And the labels of another seed are another sequence.
  int differ = 0;
  Floats x(192);
  for (int64_t i = 0; i < 100; ++i) {
    differ += a->Read(i, {}, x.data()).label != c->Read(i, {}, x.data()).label;
  }
  EXPECT_GT(differ, 50);
}

TEST(SyntheticDataset, ThreadsReadingInAnyOrderGetTheSameSamples) {
  constexpr int64_t kSize = 400;
  auto ds = Open({{"shape", std::vector<int64_t>{2, 9, 9}}, {"size", kSize}});
  const int64_t per = ds->sample_shape().numel();
  Floats serial(static_cast<size_t>(kSize * per));
  std::vector<int64_t> serial_labels(kSize);
  for (int64_t i = 0; i < kSize; ++i) {
    serial_labels[i] = ds->Read(i, {}, serial.data() + i * per).label;
  }
  constexpr int kThreads = 4;
  Floats parallel(serial.size(), std::nanf(""));
  std::vector<int64_t> labels(kSize, -1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread walks its share backwards, interleaved with the others.
      for (int64_t i = kSize - 1 - t; i >= 0; i -= kThreads) {
        labels[i] = ds->Read(i, {}, parallel.data() + i * per).label;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(labels, serial_labels);
  EXPECT_TRUE(std::equal(serial.begin(), serial.end(), parallel.begin()))
      << "a sample read by another thread in another order differs";
}

TEST(SyntheticDataset, NoiseHasUnitVarianceAroundTheClassMean) {
  constexpr int64_t kClasses = 5;
  constexpr double kSeparation = 1.5;
  auto ds = Open({{"shape", std::vector<int64_t>{3, 64, 64}},
                  {"classes", kClasses},
                  {"separation", kSeparation}});
  for (int64_t i = 0; i < 8; ++i) {
    int64_t label = -1;
    const Floats x = ReadSample(*ds, i, {}, &label);
    for (int64_t c = 0; c < 3; ++c) {
      double sum = 0, sq = 0;
      for (int64_t e = 0; e < 4096; ++e) {
        const double v = x[c * 4096 + e];
        sum += v, sq += v * v;
      }
      const double mean = sum / 4096, var = sq / 4096 - mean * mean;
      // The mean of 4096 unit-variance values: sd 1/64.
      EXPECT_NEAR(mean, DocumentedMean(kSeparation, label, c, kClasses), 0.08)
          << "sample " << i << " class " << label << " channel " << c;
      EXPECT_NEAR(var, 1.0, 0.1) << "sample " << i << " channel " << c;
    }
  }
  // separation 0: pure noise, every channel centred on 0.
  auto noise = Open({{"shape", std::vector<int64_t>{3, 64, 64}}, {"separation", 0.0}});
  const Floats x = ReadSample(*noise, 0);
  for (int64_t c = 0; c < 3; ++c) {
    double sum = 0;
    for (int64_t e = 0; e < 4096; ++e) sum += x[c * 4096 + e];
    EXPECT_NEAR(sum / 4096, 0.0, 0.08) << "channel " << c;
  }
}

TEST(SyntheticDataset, ClassesAreLearnableFromChannelMeans) {
  // A nearest-class-mean classifier on the per-channel means (what a global
  // average pool sees) gets the labels right: the signal a model can learn.
  constexpr int64_t kClasses = 10;
  auto ds = Open({{"shape", std::vector<int64_t>{1, 28, 28}}, {"classes", kClasses}});
  int correct = 0;
  constexpr int kN = 500;
  for (int64_t i = 0; i < kN; ++i) {
    int64_t label = -1;
    const Floats x = ReadSample(*ds, i, {}, &label);
    double mean = 0;
    for (float v : x) mean += v;
    mean /= static_cast<double>(x.size());
    int64_t best = 0;
    for (int64_t k = 1; k < kClasses; ++k) {
      if (std::fabs(mean - DocumentedMean(1.0, k, 0, kClasses)) <
          std::fabs(mean - DocumentedMean(1.0, best, 0, kClasses)))
        best = k;
    }
    correct += best == label;
  }
  EXPECT_GT(correct, kN * 95 / 100);
}

TEST(SyntheticDataset, BadParametersAreNamed) {
  const std::vector<int64_t> ok = {1, 4, 4};
  EXPECT_NE(OpenError({{"shape", std::vector<int64_t>{16}}}).find("synthetic: shape"),
            std::string::npos);
  EXPECT_NE(OpenError({{"shape", std::vector<int64_t>{1, 2, 3, 4}}}).find("synthetic: shape"),
            std::string::npos);
  const std::string zero = OpenError({{"shape", std::vector<int64_t>{3, 0, 32}}});
  EXPECT_NE(zero.find("synthetic: shape"), std::string::npos) << zero;
  EXPECT_NE(zero.find("[3, 0, 32]"), std::string::npos) << zero;
  EXPECT_NE(OpenError({{"shape", std::vector<int64_t>{-1, 5}}}).find("synthetic: shape"),
            std::string::npos);
  EXPECT_NE(OpenError({{"shape", ok}, {"classes", int64_t{0}}}).find("synthetic: classes"),
            std::string::npos);
  EXPECT_NE(OpenError({{"shape", ok}, {"size", int64_t{0}}}).find("synthetic: size"),
            std::string::npos);
  EXPECT_NE(OpenError({{"shape", ok}, {"separation", -1.0}}).find("synthetic: separation"),
            std::string::npos);
  auto ds = Open({{"shape", ok}, {"size", int64_t{3}}});
  Floats x(16);
  EXPECT_THROW(ds->Read(3, {}, x.data()), Error);
  EXPECT_THROW(ds->Read(-1, {}, x.data()), Error);
}

}  // namespace
}  // namespace cnnflow
