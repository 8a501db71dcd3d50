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

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ops/tensor.h"

namespace cnnflow {

// Writes `tensors` (any device; contiguous) and string metadata to `path`
// atomically: to path + ".tmp.<pid>" first, flushed and fsync'ed, then
// renamed over `path` and the directory fsync'ed, so a crash leaves either
// the old file or the new one, never a torn one. Names must be unique and
// not "__metadata__". Throws Error naming the path.
void SaveSafetensors(const std::string& path,
                     const std::vector<std::pair<std::string, Tensor>>& tensors,
                     const std::map<std::string, std::string>& metadata = {});

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
