// Data sources by name (`source: idx` in a config), each with the schema of
// its YAML parameters. A source's .cc registers itself:
//   CNNFLOW_REGISTER_SOURCE(idx, Schema("doc").Required("images", ...), [](const Args& a) {...});
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loaders/dataset.h"
#include "ops/registry.h"
#include "ops/schema.h"

namespace cnnflow {

using SourceFactory = std::function<std::shared_ptr<Dataset>(const Args&)>;

struct SourceType {
  static constexpr const char* kKind = "data source";
  Schema schema;
  SourceFactory open;
};
using SourceRegistry = Registry<SourceType>;

#define CNNFLOW_REGISTER_SOURCE(type_name, schema_expr, open_fn)                               \
  static ::cnnflow::RegisterIn<::cnnflow::SourceType> cnnflow_source_registration_##type_name( \
      #type_name, {schema_expr, open_fn})

}  // namespace cnnflow
