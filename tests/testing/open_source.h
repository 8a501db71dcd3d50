// Opens a registered data source (`source: TYPE` in a config) from a map of
// its parameters, the schema's defaults filled in, as a config would.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "loaders/source_registry.h"

namespace cnnflow::testing {

inline std::shared_ptr<Dataset> OpenSource(const std::string& type,
                                           const std::map<std::string, ParamValue>& values) {
  const SourceType* t = SourceRegistry::Get().Find(type);
  EXPECT_NE(t, nullptr) << type;
  Args a;
  for (const auto& [k, v] : values) a.Set(k, v);
  a.FillDefaults(t->schema);
  return t->open(a);
}

}  // namespace cnnflow::testing
