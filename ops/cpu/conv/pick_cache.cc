#include "ops/cpu/conv/pick_cache.h"

#include <dnnl.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "ops/error.h"

namespace cnnflow::cpu {
namespace {

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown-cpu";
}

const char* IsaName(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "isa?";
  }
}

// Picks of this process; the mutex also orders measurements.
std::mutex& Mutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, std::string>& Memory() {
  static std::map<std::string, std::string> picks;
  return picks;
}

// The pick recorded for `key` in the file's text, or "".
std::string FindInFile(int fd, const std::string& key) {
  std::string text;
  char buf[65536];
  ::lseek(fd, 0, SEEK_SET);
  for (ssize_t got; (got = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, got);
  const std::string prefix = MachineId() + "\t" + key + "\t";
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
  }
  return "";
}

}  // namespace

// Bumped whenever a cnnflow kernel that a pick weighs changes its speed (2:
// conv2d lowers a whole chunk where P < 64; 3: bf16 picks its backward
// passes; 4: bf16 weighs the f32 kernels too), so stale picks are re-measured.
constexpr int kKernelGeneration = 4;

const std::string& MachineId() {
  static const std::string id = [] {
    const dnnl_version_t* v = dnnl_version();
    return StrCat(CpuModel(), " ", IsaName(dnnl_get_effective_cpu_isa()), " onednn-", v->major, ".",
                  v->minor, ".", v->patch, " kernels-", kKernelGeneration);
  }();
  return id;
}

std::string KernelPickFile() {
  std::string dir;
  if (const char* d = std::getenv("CNNFLOW_CACHE_DIR")) {
    if (*d == '\0') return "";
    dir = d;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    dir = StrCat(x, "/cnnflow");
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    dir = StrCat(h, "/.cache/cnnflow");
  } else {
    return "";
  }
  return dir + "/kernel-picks.tsv";
}

std::string FindOrMeasure(const std::string& key, const std::function<std::string()>& measure) {
  std::lock_guard<std::mutex> lock(Mutex());
  auto it = Memory().find(key);
  if (it != Memory().end()) return it->second;

  // A file that cannot be used only costs the cross-process agreement: say
  // so once, and keep the pick in memory.
  const std::string path = KernelPickFile();
  int fd = -1;
  if (!path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0 && ::flock(fd, LOCK_EX) != 0) {
      ::close(fd);
      fd = -1;
    }
    static bool warned = false;
    if (fd < 0 && !warned) {
      warned = true;
      std::fprintf(stderr,
                   "cnnflow: cannot use the kernel pick cache %s; picks stay in this process "
                   "(set CNNFLOW_CACHE_DIR)\n",
                   path.c_str());
    }
  }
  std::string pick = fd >= 0 ? FindInFile(fd, key) : "";
  if (pick.empty()) {
    pick = measure();
    if (fd >= 0) {
      // One write of one short line to an O_APPEND file, under the lock.
      const std::string line = StrCat(MachineId(), "\t", key, "\t", pick, "\n");
      if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
        std::fprintf(stderr, "cnnflow: could not append to %s\n", path.c_str());
      }
    }
  }
  if (fd >= 0) ::close(fd);  // releases the lock
  Memory()[key] = pick;
  return pick;
}

std::string ExportPicks() {
  std::lock_guard<std::mutex> lock(Mutex());
  std::string text;
  for (const auto& [key, pick] : Memory()) text += StrCat(key, "\t", pick, "\n");
  return text;
}

void AdoptPicks(const std::string& text) {
  std::lock_guard<std::mutex> lock(Mutex());
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t tab = line.find('\t');
    CNNFLOW_ENFORCE(tab != std::string::npos, "kernel picks: bad line '", line, "'");
    Memory()[line.substr(0, tab)] = line.substr(tab + 1);
  }
}

}  // namespace cnnflow::cpu
