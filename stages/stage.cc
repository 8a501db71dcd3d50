#include "stages/stage.h"

#include <algorithm>

#include "stages/run_state.h"

namespace cnnflow {

StageRegistry& StageRegistry::Get() {
  static StageRegistry* registry = new StageRegistry();
  return *registry;
}

void StageRegistry::Register(StageType t) {
  CNNFLOW_ENFORCE(Find(t.type) == nullptr, "stage type '", t.type, "' registered twice");
  types_.push_back(std::move(t));
}

const StageType* StageRegistry::Find(const std::string& type) const {
  for (const auto& t : types_)
    if (t.type == type) return &t;
  return nullptr;
}

void StageRegistry::SetPlanner(const std::string& type, StagePlanner planner) {
  for (auto& t : types_) {
    if (t.type == type) {
      t.plan = std::move(planner);
      return;
    }
  }
  CNNFLOW_ENFORCE(false, "a plan for stage type '", type, "', which is not registered (yet)");
}

StagePlanRegistration::StagePlanRegistration(const char* type, StagePlanner planner) {
  StageRegistry::Get().SetPlanner(type, std::move(planner));
}

std::vector<std::string> StageRegistry::Names() const {
  std::vector<std::string> n;
  for (const auto& t : types_) n.push_back(t.type);
  std::sort(n.begin(), n.end());
  return n;
}

StageRegistration::StageRegistration(const char* type, Schema schema, StageFactory create,
                                     StageLayout layout) {
  StageRegistry::Get().Register({type, std::move(schema), std::move(create), layout, {}});
}

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
