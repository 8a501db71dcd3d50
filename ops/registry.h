// One registry for everything cnnflow registers by name: layer types,
// stages and their plans, data sources, optimizers and the ONNX converters.
// A kind of registered thing is a struct that names its kind for messages;
// its registry is Registry<T>, a process-wide table filled by static
// registrations in the files that define each entry:
//
//   struct OptimizerType {
//     static constexpr const char* kKind = "optimizer type";
//     Schema schema;             // what `cnnflow stages` prints
//     OptimizerFactory create;
//   };
//   using OptimizerRegistry = Registry<OptimizerType>;
//   static RegisterIn<OptimizerType> sgd("sgd", {SgdSchema(), MakeSgd});
//
// A key may hold variants at several priorities: 0 is the base entry (the
// one Names() lists and Get() returns); a higher priority is an
// implementation of the same key for a narrower case, as a layer's CUDA
// class beside its CPU one (kCudaVariant), found with Find(key, priority).
// Registries are never written after static initialisation, so reads need
// no lock.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ops/error.h"
#include "ops/schema.h"

namespace cnnflow {

// The priority of an implementation of a key that runs on GPUs.
constexpr int kCudaVariant = 1;

template <typename T>
class Registry {
 public:
  static Registry& Get() {
    static Registry* registry = new Registry();  // never destroyed: read by static destructors
    return *registry;
  }

  // Adds `value` as `key`'s entry at `priority`; the same key at the same
  // priority twice is an error (two files registering one name).
  void Register(const std::string& key, T value, int priority = 0) {
    CNNFLOW_ENFORCE(!key.empty(), T::kKind, " registered without a name");
    const bool added = entries_[key].emplace(priority, std::move(value)).second;
    CNNFLOW_ENFORCE(added, T::kKind, " '", key, "' registered twice",
                    priority == 0 ? "" : StrCat(" at priority ", priority));
  }

  // The entry of `key` at `priority`; nullptr when there is none.
  const T* Find(const std::string& key, int priority = 0) const {
    auto it = entries_.find(key);
    if (it == entries_.end()) return nullptr;
    auto v = it->second.find(priority);
    return v == it->second.end() ? nullptr : &v->second;
  }

  // The base entry of `key`; an unknown key throws ConfigError naming the
  // kind, the closest known key and every known key.
  const T& Get(const std::string& key) const {
    if (const T* t = Find(key)) return *t;
    throw ConfigError(Unknown(key));
  }

  // "unknown layer type 'conv2' (did you mean 'conv2d'?); known: ...".
  std::string Unknown(const std::string& key) const {
    return UnknownNameMessage(T::kKind, key, Names());
  }

  // The keys with a base entry, sorted.
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& [key, variants] : entries_)
      if (variants.count(0)) names.push_back(key);
    return names;
  }

 private:
  Registry() = default;
  std::map<std::string, std::map<int, T>> entries_;  // key -> priority -> entry
};

// A static registration: `static RegisterIn<T> r(key, T{...});` at namespace
// scope in the file that defines the entry.
template <typename T>
struct RegisterIn {
  RegisterIn(const std::string& key, T value, int priority = 0) {
    Registry<T>::Get().Register(key, std::move(value), priority);
  }
};

}  // namespace cnnflow
