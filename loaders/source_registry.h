// Data sources by name (`source: idx` in a config), each with the schema of
// its YAML parameters. A source's .cc registers itself:
//   CNNFLOW_REGISTER_SOURCE(idx, Schema("doc").Required("images", ...), [](const Args& a) {...});
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loaders/dataset.h"
#include "ops/schema.h"

namespace cnnflow {

using SourceFactory = std::function<std::shared_ptr<Dataset>(const Args&)>;

struct SourceType {
  std::string type;
  Schema schema;
  SourceFactory open;
};

class SourceRegistry {
 public:
  static SourceRegistry& Get();
  void Register(SourceType t);
  const SourceType* Find(const std::string& type) const;  // nullptr when unknown
  std::vector<std::string> Names() const;

 private:
  std::vector<SourceType> types_;
};

struct SourceRegistration {
  SourceRegistration(const char* type, Schema schema, SourceFactory open) {
    SourceRegistry::Get().Register({type, std::move(schema), std::move(open)});
  }
};

#define CNNFLOW_REGISTER_SOURCE(type_name, schema_expr, open_fn)                \
  static ::cnnflow::SourceRegistration cnnflow_source_registration_##type_name( \
      #type_name, schema_expr, open_fn)

}  // namespace cnnflow
