// TensorBoard event files: events.out.tfevents.<unix time>.<host>.<pid> in
// a run folder (the pid: a resumed run in the same second gets a file of
// its own), which TensorBoard (and its EventAccumulator) read as a run's
// scalars. The file is a TFRecord stream:
//   uint64 length, uint32 masked CRC-32C of the length's 8 bytes,
//   `length` bytes of data, uint32 masked CRC-32C of the data
// (mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8), one record per
// tensorflow.Event protobuf. The first event carries file_version
// "brain.Event:2"; each later one a step, a wall time and a Summary of
// scalar values (Summary.Value {tag, simple_value}).
//
// The protobuf is encoded by hand: it is five fields of two messages
// (event.proto, summary.proto), so a generated TensorFlow schema and a
// protoc step in the build would be more code than the encoder. Debian 12
// has no packaged CRC-32C (zlib's crc32 is the other polynomial), hence the
// table here.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/io/file_write.h"

namespace cnnflow {

// CRC-32C (Castagnoli), as TFRecord uses it (before masking).
uint32_t Crc32c(const void* data, size_t size);

class TfEventWriter {
 public:
  // Creates dir/events.out.tfevents.<time>.<host>.<pid> and writes the version
  // event. Throws Error when the file cannot be created.
  explicit TfEventWriter(const std::string& dir);
  // One event at `step` holding every (tag, value) of `scalars`, written at
  // once so TensorBoard sees it while the run goes on. A record that cannot
  // be written (a full disk) throws Error naming the file and the reason,
  // and leaves the file ending with the last whole record.
  void Scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  const std::string& path() const { return out_.path(); }

 private:
  void WriteRecord(const std::string& data);
  AppendFile out_;
};

}  // namespace cnnflow
