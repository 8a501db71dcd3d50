#include "ops/io/weights_file.h"

#include <cstdio>
#include <cstring>

#include "ops/error.h"
#include "ops/io/pth.h"

namespace cnnflow {

namespace {

bool EndsWith(const std::string& s, const std::string& end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

}  // namespace

SafetensorsFile LoadWeightsFile(const std::string& path) {
  // A safetensors file starts with its JSON header's length (8 bytes,
  // little-endian, at most 100 MB): "PK\3\4" would be a 67 MB header
  // followed by zeros, the legacy magic a 176 MB one, so neither collides.
  unsigned char head[4] = {0, 0, 0, 0};
  size_t n = 0;
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    n = std::fread(head, 1, sizeof head, f);
    std::fclose(f);
  }
  static const unsigned char kZip[4] = {'P', 'K', 3, 4}, kEmptyZip[4] = {'P', 'K', 5, 6};
  // torch < 1.6: PROTO 2, then LONG1 of 10 bytes (the magic 0x1950a86a20f9469cfc6c).
  static const unsigned char kLegacy[4] = {0x80, 0x02, 0x8a, 0x0a};
  if (n == 4 && (std::memcmp(head, kZip, 4) == 0 || std::memcmp(head, kEmptyZip, 4) == 0 ||
                 std::memcmp(head, kLegacy, 4) == 0)) {
    return LoadPth(path);
  }
  if (!EndsWith(path, ".pth") && !EndsWith(path, ".pt")) return LoadSafetensors(path);
  try {
    return LoadSafetensors(path);
  } catch (const Error&) {
    return LoadPth(path);  // throws: the file is neither; say what a .pth should be
  }
}

}  // namespace cnnflow
