#include "ops/schema.h"

#include <gtest/gtest.h>

#include "ops/error.h"

namespace cnnflow {
namespace {

TEST(Schema, EditDistanceCountsASwapAsOneEdit) {
  EXPECT_EQ(EditDistance("sgd", "sgd"), 0u);
  EXPECT_EQ(EditDistance("sdg", "sgd"), 1u);
  EXPECT_EQ(EditDistance("kernal", "kernel"), 1u);
  EXPECT_EQ(EditDistance("", "abc"), 3u);
}

TEST(Schema, ClosestMatchSuggestsOnlyCloseNames) {
  const std::vector<std::string> known{"epochs", "batch", "optimizer"};
  EXPECT_EQ(ClosestMatch("epohcs", known), "epochs");
  EXPECT_EQ(ClosestMatch("optimiser", known), "optimizer");
  EXPECT_EQ(ClosestMatch("learning_rate", known), "");
  EXPECT_EQ(ClosestMatch("bt", {"b", "bn"}), "") << "two letters are too short to guess from";
}

TEST(Schema, ArgsFillDefaultsAndRepeatScalars) {
  Schema s("test");
  s.Required("kernel", ParamType::kIntList, "k")
      .Optional("stride", ParamType::kIntList, int64_t{1}, "s");
  Args a;
  a.Set("kernel", std::vector<int64_t>{3});
  a.FillDefaults(s);
  EXPECT_EQ(a.Ints("kernel", 2), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(a.Ints("stride", 2), (std::vector<int64_t>{1, 1}));
  a.Set("kernel", std::vector<int64_t>{3, 2, 1});
  EXPECT_THROW(a.Ints("kernel", 2), ConfigError);
}

}  // namespace
}  // namespace cnnflow
