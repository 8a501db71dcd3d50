#include "stages/stage.h"

#include "stages/run_state.h"

namespace cnnflow {

const Dataset& RunState::dataset(const std::string& name) const {
  auto it = datasets.find(name);
  if (it == datasets.end() || !it->second) {
    std::string known;
    for (const auto& [k, v] : datasets) known += (known.empty() ? "" : ", ") + k;
    throw Error(StrCat("no data set '", name, "' in this run (have: ", known, ")"));
  }
  return *it->second;
}

}  // namespace cnnflow
