// Writing files so that a failure (a full disk, a read-only mount) is an
// Error naming the file and the reason, and never leaves a torn file under
// a name a reader takes: the two ways cnnflow writes.
//  - WriteFileAtomically: a whole file at once (a sidecar, a trace, an
//    edited config), through a temporary name beside it and a rename, so a
//    reader sees the old file or the new one.
//  - AppendFile: a log a run adds rows to as it goes (metrics.csv,
//    steps.csv, autotune.csv, the TensorBoard events), each row written
//    at once so a reader follows the run; a row that cannot be written in
//    full is cut off again, so the file ends with the last whole row.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

namespace cnnflow {

// strerror(err) as a std::string.
std::string ErrnoText(int err);

// fsync of a directory, making a rename in it durable. File systems that
// cannot fsync a directory (EINVAL, EROFS) are taken as they are; any other
// failure throws Error.
void FsyncDir(const std::string& dir);

// Writes `bytes` to `path`: `path`.tmp.<pid> is written, fsynced and renamed
// over `path`, then the directory is fsynced. On failure the temporary file
// is removed, `path` keeps what it held, and Error names the file and errno.
void WriteFileAtomically(const std::string& path, std::string_view bytes);

class AppendFile {
 public:
  // Opens `path` for appending, created if missing; `truncate` empties it
  // first. Throws Error naming the path and the reason.
  AppendFile(std::string path, bool truncate);
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;

  // Writes `bytes` at the end. When they cannot all be written, the part
  // that was is cut off again (the file ends where it did before) and
  // Error names the file and the reason.
  void Append(std::string_view bytes);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  off_t size_ = -1;  // the end of the last whole Append; -1: not a regular file
};

}  // namespace cnnflow
