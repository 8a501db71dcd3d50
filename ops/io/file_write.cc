#include "ops/io/file_write.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "ops/error.h"

namespace cnnflow {

namespace {

// Writes all of `bytes` to `fd`, retrying on EINTR and short writes.
// Returns 0, or the errno of the write that failed.
int WriteAll(int fd, std::string_view bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

std::string ErrnoText(int err) { return std::strerror(err); }

void FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL && err != EROFS) {
    throw Error(StrCat("cannot fsync directory '", dir, "': ", ErrnoText(err)));
  }
}

void WriteFileAtomically(const std::string& path, std::string_view bytes) {
  const std::string tmp = StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(StrCat("cannot create '", tmp, "': ", ErrnoText(errno)));
  if (const int err = WriteAll(fd, bytes); err != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(StrCat("cannot write '", tmp, "': ", ErrnoText(err)));
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(StrCat("cannot flush '", tmp, "': ", ErrnoText(err)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(StrCat("cannot rename '", tmp, "' to '", path, "': ", ErrnoText(err)));
  }
  FsyncDir(std::filesystem::path(path).parent_path().string());
}

AppendFile::AppendFile(std::string path, bool truncate) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0),
               0644);
  if (fd_ < 0) throw Error(StrCat("cannot open '", path_, "' to write: ", ErrnoText(errno)));
  struct stat st {};
  if (::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode)) size_ = st.st_size;
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendFile::Append(std::string_view bytes) {
  if (const int err = WriteAll(fd_, bytes); err != 0) {
    // O_APPEND: the next write goes to the new end, so no seek is needed.
    // A pipe or a device (size_ < 0) has nothing to cut.
    if (size_ >= 0 && ::ftruncate(fd_, size_) != 0) {
      throw Error(StrCat("cannot write '", path_, "': ", ErrnoText(err),
                         " (and its last row could not be cut off again: ", ErrnoText(errno), ")"));
    }
    throw Error(StrCat("cannot write '", path_, "': ", ErrnoText(err)));
  }
  if (size_ >= 0) size_ += static_cast<off_t>(bytes.size());
}

}  // namespace cnnflow
