// The fuzz entries of the YAML run config and the graph template
// (fuzz_targets.h). LoadRunConfig checks layers and stages against their
// registries, so these link the whole project.
#include <fstream>
#include <iterator>

#include "fuzz/fuzz_targets.h"
#include "fuzz/scratch.h"
#include "pipeline/run_config.h"

namespace cnnflow::fuzz {

// The YAML run config, as `cnnflow train FILE` loads it (graph template
// included, resolved against the source tree).
void FuzzRunConfig(const uint8_t* data, size_t size) {
  const std::string path = WriteScratch("config.yaml", data, size);
  (void)LoadRunConfig(path);
}

// The graph template: a real config (configs/fashion_mnist.yaml) that names
// the input as its template.
void FuzzGraphTemplate(const uint8_t* data, size_t size) {
  static const std::string config = [] {
    std::ifstream in(std::string(CNNFLOW_SOURCE_DIR) + "/configs/fashion_mnist.yaml");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.empty()) throw std::runtime_error("fuzz: cannot read configs/fashion_mnist.yaml");
    return WriteScratch("run.yaml", reinterpret_cast<const uint8_t*>(text.data()), text.size());
  }();
  const std::string tmpl = WriteScratch("template.yaml", data, size);
  (void)LoadRunConfig(config, {"graph.template=" + tmpl});
}

}  // namespace cnnflow::fuzz
