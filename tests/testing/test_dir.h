// Files for tests: a fresh, empty directory for the running test (named
// after it and the process, so parallel ctest runs never share one), and
// whole-file reads and writes.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace cnnflow::testing {

// Removes the directories TestDir() made when their test ends, unless it
// failed (or CNNFLOW_KEEP_TEST_DIRS is set): a failure's files stay to be
// looked at, and passing runs leave nothing in $TMPDIR.
class RemoveTestDirsAtTestEnd : public ::testing::EmptyTestEventListener {
 public:
  static RemoveTestDirsAtTestEnd& Get() {
    static RemoveTestDirsAtTestEnd* self = [] {
      auto* l = new RemoveTestDirsAtTestEnd;  // owned by gtest's listener list
      ::testing::UnitTest::GetInstance()->listeners().Append(l);
      return l;
    }();
    return *self;
  }
  void Add(const std::string& dir) { dirs_.insert(dir); }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    const bool keep = info.result()->Failed() || std::getenv("CNNFLOW_KEEP_TEST_DIRS");
    for (const std::string& d : dirs_) {
      std::error_code ec;
      if (keep)
        std::fprintf(stderr, "test files kept in %s\n", d.c_str());
      else
        std::filesystem::remove_all(d, ec);
    }
    dirs_.clear();
  }

 private:
  std::set<std::string> dirs_;
};

inline std::string TestDir() {
  namespace fs = std::filesystem;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  // Parameterised tests' names hold '/' ("Modes/ResumeSweep"): one folder.
  std::string name = std::string("cnnflow_") + info->test_suite_name() + "_" + info->name() + "_" +
                     std::to_string(::getpid());
  std::replace(name.begin(), name.end(), '/', '_');
  const fs::path dir = fs::path(::testing::TempDir()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  RemoveTestDirsAtTestEnd::Get().Add(dir.string());
  return dir.string();
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace cnnflow::testing
