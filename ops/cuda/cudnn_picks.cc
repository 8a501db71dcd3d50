#include "ops/cuda/cudnn_picks.h"

#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

#include "ops/cuda/kernels.h"  // declares SetCudnnPicksFile too
#include "ops/error.h"
#include "ops/io/file_write.h"

namespace cnnflow::cuda {
namespace {

struct Store {
  std::mutex mu;
  std::string path;
  bool write = false;
  std::map<std::pair<std::string, std::string>, std::string> picks;  // (machine, key) -> pick
};

Store& TheStore() {
  static auto* s = new Store();  // never destroyed: layers may pick during exit
  return *s;
}

// Under s.mu.
void WriteBack(Store& s) {
  if (!s.write || s.path.empty()) return;
  std::string text =
      "# cuDNN convolution picks of graph.deterministic: machine<TAB>key<TAB>algo math\n";
  for (const auto& [at, pick] : s.picks) text += at.first + "\t" + at.second + "\t" + pick + "\n";
  WriteFileAtomically(s.path, text);
}

}  // namespace

void SetCudnnPicksFile(const std::string& path, bool write) {
  Store& s = TheStore();
  std::lock_guard<std::mutex> lock(s.mu);
  s.path = path;
  s.write = write;
  if (path.empty()) return;
  std::ifstream in(path);
  if (in) {
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.empty() || line[0] == '#') continue;
      const size_t a = line.find('\t');
      const size_t b = a == std::string::npos ? a : line.find('\t', a + 1);
      if (b == std::string::npos || b + 1 >= line.size()) {
        throw Error(StrCat(path, ":", n, ": not a 'machine<TAB>key<TAB>pick' line: '", line, "'"));
      }
      s.picks[{line.substr(0, a), line.substr(a + 1, b - a - 1)}] = line.substr(b + 1);
    }
  }
  WriteBack(s);
}

std::string FindCudnnPick(const std::string& machine, const std::string& key) {
  Store& s = TheStore();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto it = s.picks.find({machine, key});
  return it == s.picks.end() ? std::string() : it->second;
}

std::string RecordCudnnPick(const std::string& machine, const std::string& key,
                            const std::string& pick) {
  Store& s = TheStore();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto [it, added] = s.picks.emplace(std::make_pair(machine, key), pick);
  if (added) WriteBack(s);
  return it->second;
}

}  // namespace cnnflow::cuda
