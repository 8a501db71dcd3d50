// The .ts parser on files written here (multichannel, variable length,
// missing values, CRLF, no trailing newline, each kind of error with its
// line number) and, when present, on the real BasicMotions and
// JapaneseVowels files of ../shared/data/ucr.
#include "loaders/ts_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "ops/error.h"
#include "tests/testing/helpers.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

const char* kHeader =
    "# A comment line, then the header\n"
    "#   with an indented comment\n"
    "@problemName Tiny\n"
    "@timeStamps false\n"
    "@missing true\n"
    "@univariate false\n"
    "@dimensions 2\n"
    "@equalLength false\n"
    "@classLabel true walk run sit\n"
    "@data\n";

// Expects ParseTs(text) to throw an Error whose message holds every piece.
void ExpectError(const std::string& text, const std::vector<std::string>& pieces) {
  testing::ExpectContains(testing::ErrorOf([&] { ParseTs(text, "fixture.ts"); }), pieces);
}

TEST(TsFormatTest, MultichannelVariableLengthWithoutTrailingNewline) {
  const std::string dir = testing::TestDir();
  const std::string path = dir + "/tiny.ts";
  // Three cases of lengths 3, 5 and 2; CRLF on one line, spaces around
  // values, the last line with no newline.
  testing::WriteBytes(path, std::string(kHeader) +
                                "1,2,3:10,20,30:run\n"
                                "0.5, -1.25 ,+2e1,4,5:6,7,8,9,10:sit\r\n"
                                "\n"
                                "-7,8:9,-10:walk");
  const TsFile f = ReadTsFile(path);
  EXPECT_EQ(f.path, path);
  EXPECT_EQ(f.problem_name, "Tiny");
  EXPECT_EQ(f.class_labels, (std::vector<std::string>{"walk", "run", "sit"}));
  EXPECT_EQ(f.channels, 2);
  ASSERT_EQ(f.size(), 3);
  EXPECT_EQ(f.lengths, (std::vector<int64_t>{3, 5, 2}));
  EXPECT_EQ(f.labels, (std::vector<int64_t>{1, 2, 0}));
  EXPECT_EQ(f.cases[0], (std::vector<float>{1, 2, 3, 10, 20, 30}));
  EXPECT_EQ(f.cases[1], (std::vector<float>{0.5f, -1.25f, 20, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(f.cases[2], (std::vector<float>{-7, 8, 9, -10}));
  EXPECT_EQ(f.min_length(), 2);
  EXPECT_EQ(f.max_length(), 5);
  EXPECT_EQ(f.missing_values, 0);
}

TEST(TsFormatTest, HeaderKeysAreCaseInsensitiveAndDimensionsMayBeInferred) {
  const TsFile f = ParseTs(
      "@PROBLEMNAME x\n@univariate FALSE\n@classlabel True 2 1\n@DATA\n1:2:3:1\n4:5:6:2\n", "x.ts");
  EXPECT_EQ(f.channels, 3);
  EXPECT_EQ(f.labels, (std::vector<int64_t>{1, 0}));  // "1" is the 2nd listed label
  EXPECT_EQ(f.cases[1], (std::vector<float>{4, 5, 6}));
}

TEST(TsFormatTest, MissingValuesAreInterpolated) {
  // Interior gaps: linear between neighbours; leading / trailing gaps: the
  // nearest known value; an all-missing channel: 0. NaN counts as missing.
  const TsFile f = ParseTs(
      std::string(kHeader) + "1,?,?,4,?:?,?,NaN,?,?:walk\n?,2,?,6,8:?,3,?,?,-3:run\n", "m.ts");
  ASSERT_EQ(f.size(), 2);
  EXPECT_EQ(f.cases[0], (std::vector<float>{1, 2, 3, 4, 4, 0, 0, 0, 0, 0}));
  EXPECT_EQ(f.cases[1], (std::vector<float>{2, 2, 4, 6, 8, 3, 3, 1, -1, -3}));
  EXPECT_EQ(f.missing_values, 13);
  for (const auto& c : f.cases) {
    for (float v : c) EXPECT_FALSE(std::isnan(v));
  }
}

TEST(TsFormatTest, ErrorsNameTheFileTheLineAndWhatIsWrong) {
  // The header is 10 lines: the first case is line 11.
  const std::string h = kHeader;
  ExpectError(h + "1,2:3,4:walk\n1,2x,3:4,5,6:run\n",
              {"fixture.ts:12:", "bad number '2x'", "channel 1", "value 2"});
  ExpectError(h + "1,2:3,4:walk\n1,,3:4,5,6:run\n", {"fixture.ts:12:", "bad number ''"});
  ExpectError(h + "1,2:3,4:walk\n\n1,2:3,4:5,6:run\n",
              {"fixture.ts:13:", "3 channels, expected 2"});
  ExpectError(h + "1,2:walk\n", {"fixture.ts:11:", "1 channels, expected 2 (@dimensions)"});
  ExpectError(h + "1,2:3,4:jump\n",
              {"fixture.ts:11:", "unknown class label 'jump'", "walk, run, sit"});
  ExpectError(h + "1,2:3,4,5:walk\n",
              {"fixture.ts:11:", "channel 2 has 3 values but channel 1 has 2"});
  ExpectError(h + "1,1e99:3,4:walk\n", {"fixture.ts:11:", "not a finite float"});
  ExpectError(h + "1,inf:3,4:walk\n", {"fixture.ts:11:", "not a finite float"});
  ExpectError("@classLabel true a b\n1,2,3:a\n", {"fixture.ts:2:", "before @data"});
  ExpectError("# only a header\n@classLabel true a b\n", {"fixture.ts", "no @data"});
  ExpectError("@classLabel true a b\n@data\n", {"fixture.ts", "no cases"});
  ExpectError("@classLabel true a\n@equalLength true\n@seriesLength 3\n@data\n1,2,3:a\n1,2:a\n",
              {"fixture.ts:6:", "length 2", "@equalLength"});
  ExpectError("@classLabel true a\n@equalLength true\n@seriesLength 4\n@data\n1,2,3:a\n",
              {"fixture.ts:5:", "@seriesLength is 4"});
  ExpectError("@timeStamps true\n@classLabel true a\n@data\n",
              {"fixture.ts:1:", "@timeStamps true"});
  ExpectError("@classLabel false\n@data\n1,2\n", {"fixture.ts:1:", "@classLabel false"});
  ExpectError("@data\n1,2:a\n", {"fixture.ts:1:", "no @classLabel"});
  ExpectError("@univariate maybe\n", {"fixture.ts:1:", "true or false", "'maybe'"});
  ExpectError("@classLabel true a\n@data\n@missing true\n", {"fixture.ts:3:", "after @data"});
  ExpectError("@univariate true\n@classLabel true a\n@data\n1,2:3,4:a\n",
              {"fixture.ts:4:", "2 channels, expected 1 (@univariate true)"});
  try {
    ReadTsFile(testing::TestDir() + "/absent.ts");
    ADD_FAILURE() << "a missing file was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("absent.ts"), std::string::npos) << e.what();
  }
}

std::string UcrPath(const std::string& name) {
  for (const char* dir : {"../shared/data/ucr", "/work/shared/data/ucr"}) {
    const std::string p = std::string(dir) + "/" + name;
    if (fs::exists(p)) return p;
  }
  return "";
}

TEST(TsFormatTest, RealBasicMotionsTrain) {
  const std::string path = UcrPath("BasicMotions_TRAIN.ts");
  if (path.empty()) GTEST_SKIP() << "BasicMotions_TRAIN.ts not found";
  const TsFile f = ReadTsFile(path);
  EXPECT_EQ(f.problem_name, "BasicMotions");
  EXPECT_EQ(f.class_labels,
            (std::vector<std::string>{"Standing", "Running", "Walking", "Badminton"}));
  ASSERT_EQ(f.size(), 40);
  EXPECT_EQ(f.channels, 6);
  std::vector<int> per_class(4);
  for (int64_t i = 0; i < f.size(); ++i) {
    EXPECT_EQ(f.lengths[i], 100);
    ASSERT_EQ(f.cases[i].size(), 600u);
    ++per_class.at(f.labels[i]);
  }
  EXPECT_EQ(per_class, (std::vector<int>{10, 10, 10, 10}));
  // The file's first value, as printed in it.
  EXPECT_FLOAT_EQ(f.cases[0][0], 0.079106f);
  EXPECT_EQ(f.missing_values, 0);
}

TEST(TsFormatTest, RealJapaneseVowelsIsVariableLength) {
  const std::string path = UcrPath("JapaneseVowels_TRAIN.ts");
  if (path.empty()) GTEST_SKIP() << "JapaneseVowels_TRAIN.ts not found";
  const TsFile f = ReadTsFile(path);
  EXPECT_EQ(f.channels, 12);
  EXPECT_EQ(f.class_labels.size(), 9u);
  EXPECT_EQ(f.size(), 270);
  EXPECT_GE(f.min_length(), 7);
  EXPECT_LE(f.max_length(), 29);
  EXPECT_LT(f.min_length(), f.max_length());
}

}  // namespace
}  // namespace cnnflow
