// data.device_resident's host side (stages/resident_data.h), on the real
// CIFAR-10 JPEGs of tests/data: with no GPU listed, Make decodes every
// record once and keeps every label as the loader reads it; where the GPU
// cannot make the set's batches (not an image source, an augmentation it
// does not make) it says why and holds nothing. The upload and the batch
// kernel are tests/ops/cuda/resident_set_test.cc's (GPU).
#include "stages/resident_data.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "loaders/source_registry.h"
#include "ops/schema.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<Dataset> Open(const std::string& source, Args a) {
  const SourceType* type = SourceRegistry::Get().Find(source);
  EXPECT_NE(type, nullptr) << source;
  a.FillDefaults(type->schema);
  return type->open(a);
}

Args SampleFolder() {
  const char* src = std::getenv("CNNFLOW_SOURCE_DIR");
  Args a;
  a.Set("path", (fs::path(src ? src : ".") / "tests/data/cifar10-jpeg-sample").string());
  a.Set("shape", std::vector<int64_t>{3, 32, 32});
  a.Set("pad", int64_t{2});
  a.Set("random_crop", true);
  a.Set("hflip", std::string("alternate"));
  return a;
}

TEST(ResidentData, DecodesEveryRecordOnceWithTheLoadersLabels) {
  const auto data = Open("folder", SampleFolder());
  const ResidentData::Made made = ResidentData::Make("train", *data, true, {}, 2);
  ASSERT_NE(made.data, nullptr) << made.why_not;
  EXPECT_EQ(made.data->name(), "train");
  EXPECT_EQ(made.data->bytes(), static_cast<size_t>(data->size()) * 3 * 32 * 32);
  std::vector<float> pixels(3 * 32 * 32);
  for (int64_t i = 0; i < data->size(); ++i) {
    const ReadResult r = data->Read(i, ReadContext{1, 0, true}, pixels.data());
    ASSERT_TRUE(r.ok()) << r.error;
    EXPECT_EQ(made.data->label(i), r.label) << data->Key(i);
  }
  EXPECT_GE(made.decode_seconds, 0);
}

TEST(ResidentData, SaysWhyWhereTheGpuCannotMakeTheBatches) {
  Args synthetic;
  synthetic.Set("shape", std::vector<int64_t>{3, 8, 8});
  synthetic.Set("classes", int64_t{4});
  synthetic.Set("size", int64_t{16});
  const auto noise = Open("synthetic", synthetic);
  const ResidentData::Made a = ResidentData::Make("train", *noise, true, {}, 1);
  EXPECT_EQ(a.data, nullptr);
  EXPECT_NE(a.why_not.find("not an image source"), std::string::npos) << a.why_not;

  Args resized = SampleFolder();
  resized.Set("resize_min_side", int64_t{36});
  const ResidentData::Made b = ResidentData::Make("train", *Open("folder", resized), true, {}, 1);
  EXPECT_EQ(b.data, nullptr);
  EXPECT_NE(b.why_not.find("resize_min_side"), std::string::npos) << b.why_not;

  const ResidentData::Made c =
      ResidentData::Make("train", *Open("folder", SampleFolder()), false, {}, 1);
  EXPECT_EQ(c.data, nullptr);
  EXPECT_NE(c.why_not.find("normalize"), std::string::npos) << c.why_not;
}

}  // namespace
}  // namespace cnnflow
