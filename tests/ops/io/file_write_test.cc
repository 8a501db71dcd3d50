#include "ops/io/file_write.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <functional>
#include <string>

#include "ops/error.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

// Names in `dir` that look like a temporary file.
std::string Temporaries(const std::string& dir) {
  std::string names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.find(".tmp") != std::string::npos) names += n + " ";
  }
  return names;
}

// Runs `body` in a child process whose files may not grow past `max_bytes`
// (RLIMIT_FSIZE: a write past it is cut short, the next fails with EFBIG,
// as on a disk that fills mid-write). Returns the message of the Error
// `body` threw, or "" when it threw none.
std::string WithFileSizeLimit(rlim_t max_bytes, const std::function<void()>& body) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
    const rlimit lim{max_bytes, max_bytes};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(2);
    try {
      body();
    } catch (const Error& e) {
      const std::string what = e.what();
      if (::write(fds[1], what.data(), what.size()) < 0) ::_exit(3);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string what;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
    what.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  return what;
}

TEST(FileWrite, AtomicWriteReplacesTheFileAndLeavesNoTemporary) {
  const std::string dir = testing::TestDir();
  const std::string path = dir + "/config.yaml";
  WriteFileAtomically(path, "old\n");
  WriteFileAtomically(path, "new text\n");
  EXPECT_EQ(testing::ReadBytes(path), "new text\n");
  EXPECT_EQ(Temporaries(dir), "");
}

// The disk fills while the new file is written: the old one is left as it
// was, the half-written temporary is removed, and the error says why.
TEST(FileWrite, AtomicWriteThatFailsKeepsTheOldFile) {
  const std::string dir = testing::TestDir();
  const std::string path = dir + "/config.yaml";
  WriteFileAtomically(path, "old\n");
  const std::string what =
      WithFileSizeLimit(1000, [&] { WriteFileAtomically(path, std::string(5000, 'x')); });
  EXPECT_NE(what.find("cannot write '" + path + ".tmp."), std::string::npos) << what;
  EXPECT_NE(what.find("File too large"), std::string::npos) << what;
  EXPECT_EQ(testing::ReadBytes(path), "old\n");
  EXPECT_EQ(Temporaries(dir), "");
}

TEST(FileWrite, AtomicWriteNamesAMissingDirectory) {
  const std::string path = testing::TestDir() + "/no/such/dir/trace.json";
  try {
    WriteFileAtomically(path, "{}");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create '" + path + ".tmp."), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos);
  }
}

TEST(FileWrite, AppendFileAppendsOrStartsEmpty) {
  const std::string path = testing::TestDir() + "/steps.csv";
  {
    AppendFile f(path, /*truncate=*/true);
    f.Append("step,loss\n");
    f.Append("1,2.5\n");
    EXPECT_EQ(testing::ReadBytes(path), "step,loss\n1,2.5\n");  // written at once
  }
  AppendFile(path, /*truncate=*/false).Append("2,2.1\n");
  EXPECT_EQ(testing::ReadBytes(path), "step,loss\n1,2.5\n2,2.1\n");
  AppendFile(path, /*truncate=*/true).Append("step,loss\n");
  EXPECT_EQ(testing::ReadBytes(path), "step,loss\n");
}

// A row that only partly fits is cut off again: the file ends with the
// last whole row, and the rows after it go on from there.
TEST(FileWrite, AppendFileCutsOffARowThatCannotBeWrittenWhole) {
  const std::string path = testing::TestDir() + "/steps.csv";
  const std::string row(60, 'r');
  const std::string what = WithFileSizeLimit(100, [&] {
    AppendFile f(path, /*truncate=*/true);
    f.Append(row + "\n");  // 61 bytes
    try {
      f.Append(row + "\n");  // 39 of them fit
    } catch (const Error&) {
      f.Append("short\n");  // 67 bytes: fits again
      throw;
    }
  });
  EXPECT_NE(what.find("cannot write '" + path + "': File too large"), std::string::npos) << what;
  EXPECT_EQ(testing::ReadBytes(path), row + "\nshort\n");
}

// A real full disk: /dev/full fails every write with ENOSPC.
TEST(FileWrite, AppendFileNamesAFullDisk) {
  AppendFile f("/dev/full", /*truncate=*/false);
  try {
    f.Append("1,2.5\n");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "cannot write '/dev/full': No space left on device");
  }
}

TEST(FileWrite, AppendFileNamesAFileItCannotOpen) {
  const std::string path = testing::TestDir() + "/no/such/metrics.csv";
  try {
    AppendFile f(path, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot open '" + path + "' to write: No such file or directory");
  }
}

}  // namespace
}  // namespace cnnflow
