#include "tools/hosts.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ops/error.h"

namespace cnnflow {
namespace {

using Names = std::vector<std::string>;

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

Names NamesOf(const std::vector<Host>& hosts) {
  Names names;
  for (const auto& h : hosts) names.push_back(h.name);
  return names;
}

TEST(SlurmNodeList, ExpandsRangesKeepingTheirPadding) {
  EXPECT_EQ(ParseSlurmNodeList("node[01-04,07],gpu5,rack[1-2]-n[3-4]"),
            (Names{"node01", "node02", "node03", "node04", "node07", "gpu5", "rack1-n3", "rack1-n4",
                   "rack2-n3", "rack2-n4"}));
  EXPECT_EQ(ParseSlurmNodeList("n[8-10]"), (Names{"n8", "n9", "n10"}));
  EXPECT_EQ(ParseSlurmNodeList("n[098-101]"), (Names{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(ParseSlurmNodeList("c[3]"), (Names{"c3"}));
  EXPECT_EQ(ParseSlurmNodeList("[1-2]x"), (Names{"1x", "2x"}));
  EXPECT_EQ(ParseSlurmNodeList("solo"), (Names{"solo"}));
}

TEST(SlurmNodeList, NamesTheBadCharacter) {
  const auto err = [](const std::string& list) {
    return ErrorOf([&] { ParseSlurmNodeList(list, "SLURM_JOB_NODELIST"); });
  };
  EXPECT_NE(err("node[01-").find("SLURM_JOB_NODELIST=\"node[01-\": '[' without ']' at character 5"),
            std::string::npos)
      << err("node[01-");
  EXPECT_NE(err("a,]b").find("']' without '[' at character 3"), std::string::npos);
  EXPECT_NE(err("a[1[2]]").find("'[' inside brackets at character 4"), std::string::npos);
  EXPECT_NE(err("a,,b").find("empty name at character 3"), std::string::npos);
  EXPECT_NE(err("").find("empty name at character 1"), std::string::npos);
  EXPECT_NE(err("n[4-2]").find("range '4-2' runs backwards at character 3"), std::string::npos);
  EXPECT_NE(err("n[1,]").find("an empty range at character 5"), std::string::npos);
  EXPECT_NE(err("n[a-b]").find("range 'a-b' is not N or N-M of digits"), std::string::npos);
  EXPECT_NE(err("n[1-2] ,m").find("a space at character 7"), std::string::npos);
  EXPECT_NE(err("n[0-99999999]").find("expands to over"), std::string::npos);
  EXPECT_NE(err("a[1-2],a1").find("'a1' is listed twice"), std::string::npos);
}

TEST(HostFile, ReadsOpenMpisForm) {
  const std::vector<Host> hosts = ParseHostFile(
      "# the rack\n"
      "a slots=2\n"
      "\n"
      "  b   # spare\n"
      "c slots=4 max_slots=8\n",
      "hosts.txt");
  ASSERT_EQ(NamesOf(hosts), (Names{"a", "b", "c"}));
  EXPECT_EQ(hosts[0].slots, 2);
  EXPECT_EQ(hosts[1].slots, 0);
  EXPECT_EQ(hosts[2].slots, 4);
}

TEST(HostFile, ErrorsNameFileAndLine) {
  const auto err = [](const std::string& text) {
    return ErrorOf([&] { ParseHostFile(text, "hosts.txt"); });
  };
  EXPECT_NE(err("a\nb slots=x\n").find("hosts.txt:2: 'slots=x' is not slots=N"), std::string::npos);
  EXPECT_NE(err("a slots=0\n").find("hosts.txt:1: 'slots=0'"), std::string::npos);
  EXPECT_NE(err("a cpus=2\n").find("hosts.txt:1: 'cpus=2'"), std::string::npos);
  EXPECT_NE(err("a\n# b\na\n").find("hosts.txt:3: host 'a' is listed twice (also hosts.txt:1)"),
            std::string::npos);
  EXPECT_NE(err("# none\n\n").find("hosts.txt: no hosts"), std::string::npos);
}

TEST(HostFile, ReadsAFileAndNamesAMissingOne) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("hosts_test_" + std::to_string(getpid())))
          .string();
  std::ofstream(path) << "x\ny slots=3\n";
  EXPECT_EQ(NamesOf(ReadHostFile(path)), (Names{"x", "y"}));
  std::remove(path.c_str());
  EXPECT_NE(ErrorOf([&] { ReadHostFile(path); }).find(path + ": cannot be read"),
            std::string::npos);
}

TEST(HostList, NamesWithOptionalSlots) {
  const std::vector<Host> hosts = ParseHostList("a,b:2,c");
  ASSERT_EQ(NamesOf(hosts), (Names{"a", "b", "c"}));
  EXPECT_EQ(hosts[1].slots, 2);
  EXPECT_EQ(hosts[2].slots, 0);
  EXPECT_NE(ErrorOf([] { ParseHostList("a,,b"); }).find("host 2: '' is not a host name"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { ParseHostList("a:0"); }).find("'a:0' is not HOST or HOST:SLOTS"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { ParseHostList("a,b,a"); }).find("host 3: host 'a' is listed twice"),
            std::string::npos);
}

}  // namespace
}  // namespace cnnflow
