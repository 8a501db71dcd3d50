// Replays the fuzz inputs through the fuzz entries (fuzz/fuzz_targets.h)
// with the normal compiler, so they run in the regular suite and CI:
//  - fuzz/regressions/<target>/*: inputs that once crashed, hung or allocated
//    without bound. Each must now be rejected with a named cnnflow::Error
//    (the test prints it) whose message holds the text of FILE.expect when
//    there is one, or, for files named *.ok, be accepted.
//  - fuzz/corpus/<target>/*: the seeds; each is accepted or rejected with a
//    cnnflow::Error, never anything else.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/fuzz_targets.h"
#include "ops/error.h"

namespace cnnflow::fuzz {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> Files(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() != ".expect") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string Bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// "" when the entry accepted the input, else the cnnflow::Error's message.
// Any other exception fails the test with its text.
std::string Replay(const FuzzTarget& t, const fs::path& p) {
  const std::string b = Bytes(p);
  try {
    t.entry(reinterpret_cast<const uint8_t*>(b.data()), b.size());
  } catch (const Error& e) {
    return e.what()[0] ? e.what() : "(empty message)";
  } catch (const std::exception& e) {
    ADD_FAILURE() << p << ": not a cnnflow::Error: " << e.what();
    return "";
  }
  return "";
}

class FuzzReplay : public testing::TestWithParam<FuzzTarget> {};

TEST_P(FuzzReplay, CrashInputsGiveNamedErrors) {
  const FuzzTarget& t = GetParam();
  for (const fs::path& p : Files(fs::path("fuzz/regressions") / t.name)) {
    SCOPED_TRACE(p.string());
    const std::string error = Replay(t, p);
    if (p.extension() == ".ok") {
      EXPECT_EQ(error, "") << p;
    } else {
      EXPECT_NE(error, "") << p << " was accepted; expected a named error";
      std::printf("  %s: %s\n", p.filename().c_str(), error.c_str());
      const fs::path expect = p.string() + ".expect";
      if (fs::exists(expect)) {
        std::string want = Bytes(expect);
        while (!want.empty() && (want.back() == '\n' || want.back() == ' ')) want.pop_back();
        EXPECT_NE(error.find(want), std::string::npos)
            << p << ": expected the error to say '" << want << "'";
      }
    }
  }
}

TEST_P(FuzzReplay, SeedsRunCleanly) {
  const FuzzTarget& t = GetParam();
  const auto seeds = Files(fs::path("fuzz/corpus") / t.name);
  EXPECT_FALSE(seeds.empty()) << "no seeds in fuzz/corpus/" << t.name;
  for (const fs::path& p : seeds) {
    SCOPED_TRACE(p.string());
    (void)Replay(t, p);
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzReplay, testing::ValuesIn(FuzzTargets()),
                         [](const testing::TestParamInfo<FuzzTarget>& i) {
                           return std::string(i.param.name);
                         });

}  // namespace
}  // namespace cnnflow::fuzz
