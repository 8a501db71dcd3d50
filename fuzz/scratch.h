// What the fuzz entries share: a per-process scratch folder for parsers
// that take a path (IDX through zlib, safetensors, the sidecar, the YAML
// config: the input is written to a file there first, so the very code a
// run executes is what is fuzzed), and Finding() for a broken invariant.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace cnnflow::fuzz {

// A finding that is not a crash: a round trip that changed the value, a
// decoder that reported success with inconsistent sizes. Not a cnnflow::Error,
// so the drivers report it.
[[noreturn]] inline void Finding(const std::string& what) {
  throw std::logic_error("fuzz finding: " + what);
}

// This process's scratch folder (under $TMPDIR, /tmp by default), removed at
// exit unless CNNFLOW_FUZZ_KEEP_SCRATCH is set.
// The path is never destroyed: a static one would be, before the atexit
// handler (registered inside its initialiser) ran, and the folder would stay.
inline const std::filesystem::path& Scratch() {
  static const std::filesystem::path* dir = [] {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/cnnflow-fuzz-XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("fuzz: cannot create " + tmpl);
    auto* path = new std::filesystem::path(tmpl);
    if (!std::getenv("CNNFLOW_FUZZ_KEEP_SCRATCH"))
      std::atexit([] {
        std::error_code ec;
        std::filesystem::remove_all(Scratch(), ec);
      });
    return path;
  }();
  return *dir;
}

inline std::string WriteScratch(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = (Scratch() / name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) throw std::runtime_error("fuzz: cannot write " + path);
  return path;
}

// Reads every byte of a decoded payload, so a view that points past its
// value is caught by ASan.
inline uint64_t Touch(const uint8_t* p, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum += p[i];
  return sum;
}

}  // namespace cnnflow::fuzz
