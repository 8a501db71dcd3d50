// The scaling table of `cnnflow bench`: rates to three significant digits,
// whatever their size (a ResNet-50 on a CPU makes 5 images/s, model A 4,000).
#include "pipeline/bench.h"

#include <gtest/gtest.h>

namespace cnnflow {
namespace {

TEST(BenchTable, RatesHaveThreeSignificantDigits) {
  std::vector<BenchRow> rows(3);
  rows[0].images_per_s = 5.2349;
  rows[1].images_per_s = 48.71;
  rows[2].images_per_s = 4163.2;
  const std::string t = BenchTable(rows);
  EXPECT_NE(t.find(" 5.23 "), std::string::npos) << t;
  EXPECT_NE(t.find(" 48.7 "), std::string::npos) << t;
  EXPECT_NE(t.find(" 4163 "), std::string::npos) << t;
}

}  // namespace
}  // namespace cnnflow
