#include "stages/stage.h"

#include "stages/run_context.h"

namespace cnnflow {

const Dataset& RunContext::dataset(const std::string& name) const {
  auto it = datasets.find(name);
  if (it == datasets.end() || !it->second) {
    std::string known;
    for (const auto& [k, v] : datasets) known += (known.empty() ? "" : ", ") + k;
    throw Error(StrCat("no data set '", name, "' in this run (have: ", known, ")"));
  }
  return *it->second;
}

}  // namespace cnnflow
