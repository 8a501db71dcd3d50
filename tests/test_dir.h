// A fresh, empty directory for the running test (named after it and the
// process, so parallel ctest runs never share one).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace cnnflow::testing {

inline std::string TestDir() {
  namespace fs = std::filesystem;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir = fs::path(::testing::TempDir()) /
                       (std::string("cnnflow_") + info->test_suite_name() + "_" + info->name() +
                        "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

}  // namespace cnnflow::testing
