// Checkpoints in the safetensors layout, which PyTorch, JAX and TF read with
// no code of ours:
//   8 bytes   N, the header length (unsigned little-endian)
//   N bytes   JSON: {"__metadata__": {string: string},
//                    "<name>": {"dtype": "F32", "shape": [...],
//                               "data_offsets": [begin, end]}, ...}
//             padded with spaces to a multiple of 8
//   the rest  raw little-endian tensor data; offsets are relative to the
//             start of this section, tensors back to back in the given order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ops/tensor.h"

namespace cnnflow {

// What SaveSafetensors wrote, for a checkpoint's sidecar to record.
struct SafetensorsWritten {
  uint64_t bytes = 0;  // the file's size
  uint32_t crc32 = 0;  // CRC-32 of the whole file, as Python's zlib.crc32
};

// Writes `tensors` (any device; contiguous) and string metadata to `path`
// atomically: to path + ".tmp.<pid>" first, flushed and fsync'ed, then
// renamed over `path` and the directory fsync'ed, so a crash leaves either
// the old file or the new one, never a torn one. Names must be unique and
// not "__metadata__". Fills `written` (when not null) with the file's size
// and checksum, computed from the bytes as they are written (no second
// read). Throws Error naming the path.
void SaveSafetensors(const std::string& path,
                     const std::vector<std::pair<std::string, Tensor>>& tensors,
                     const std::map<std::string, std::string>& metadata = {},
                     SafetensorsWritten* written = nullptr);

// CRC-32 (the polynomial of zlib, PNG and Ethernet) of `n` bytes, continuing
// from `crc` (0 to start): Crc32(b, n2, Crc32(a, n1)) == CRC of a then b.
uint32_t Crc32(const void* data, size_t n, uint32_t crc = 0);
// The size and CRC-32 of a whole file, read in chunks. Throws Error naming
// the path.
SafetensorsWritten FileSizeAndCrc32(const std::string& path);

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;
  // Host tensors in the order of their data offsets.
  std::vector<std::pair<std::string, Tensor>> tensors;
  // nullptr when absent.
  const Tensor* Find(const std::string& name) const;
};

// Reads a safetensors file into host tensors. Validates the header length
// against the file size, the JSON, the dtypes (F32, F64, F16, BF16; others
// are rejected by name), that each shape matches its byte range, and that
// ranges lie in the data section and do not overlap. Every error names the
// file and what is wrong.
SafetensorsFile LoadSafetensors(const std::string& path);

}  // namespace cnnflow
