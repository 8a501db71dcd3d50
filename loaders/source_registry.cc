#include "loaders/source_registry.h"

#include <algorithm>

#include "ops/error.h"

namespace cnnflow {

SourceRegistry& SourceRegistry::Get() {
  static SourceRegistry* registry = new SourceRegistry();
  return *registry;
}

void SourceRegistry::Register(SourceType t) {
  CNNFLOW_ENFORCE(Find(t.type) == nullptr, "data source '", t.type, "' registered twice");
  types_.push_back(std::move(t));
}

const SourceType* SourceRegistry::Find(const std::string& type) const {
  for (const auto& t : types_)
    if (t.type == type) return &t;
  return nullptr;
}

std::vector<std::string> SourceRegistry::Names() const {
  std::vector<std::string> n;
  for (const auto& t : types_) n.push_back(t.type);
  std::sort(n.begin(), n.end());
  return n;
}

}  // namespace cnnflow
