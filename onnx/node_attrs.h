// An ONNX node's attributes as the importer's converters read them: each by
// name and type, once; Done() then fails for any attribute no converter
// read, so an attribute cnnflow has no counterpart for is an error, never
// silently dropped.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ops/error.h"

namespace cnnflow::onnx_io {

// A float attribute as the double it was written from (0.1f -> 0.1, not
// 0.10000000149): the shortest decimal that reads back as the same float.
double Decimal(float f);

class NodeAttrs {
 public:
  NodeAttrs(const onnx::NodeProto& n, std::string where) : n_(n), where_(std::move(where)) {}

  int64_t Int(const std::string& name, int64_t dflt) {
    const onnx::AttributeProto* a = Find(name, onnx::AttributeProto::INT);
    return a ? a->i() : dflt;
  }
  double Float(const std::string& name, double dflt) {
    const onnx::AttributeProto* a = Find(name, onnx::AttributeProto::FLOAT);
    return a ? Decimal(a->f()) : dflt;
  }
  std::string String(const std::string& name, const std::string& dflt) {
    const onnx::AttributeProto* a = Find(name, onnx::AttributeProto::STRING);
    return a ? a->s() : dflt;
  }
  std::vector<int64_t> Ints(const std::string& name, std::vector<int64_t> dflt) {
    const onnx::AttributeProto* a = Find(name, onnx::AttributeProto::INTS);
    return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : dflt;
  }
  std::vector<float> Floats(const std::string& name) {
    const onnx::AttributeProto* a = Find(name, onnx::AttributeProto::FLOATS);
    return a ? std::vector<float>(a->floats().begin(), a->floats().end()) : std::vector<float>{};
  }
  const onnx::TensorProto* TensorAttr(const std::string& name) {
    const onnx::AttributeProto* a = Find(name, onnx::AttributeProto::TENSOR);
    return a ? &a->t() : nullptr;
  }
  bool Has(const std::string& name) const {
    for (const auto& a : n_.attribute())
      if (a.name() == name) return true;
    return false;
  }
  void Done() const {
    for (const auto& a : n_.attribute()) {
      if (!read_.count(a.name())) {
        throw Error(StrCat(where_, ": attribute '", a.name(),
                           "' has no counterpart in cnnflow's layer for this op"));
      }
    }
  }

 private:
  const onnx::AttributeProto* Find(const std::string& name,
                                   onnx::AttributeProto::AttributeType type) {
    read_.insert(name);
    for (const auto& a : n_.attribute()) {
      if (a.name() != name) continue;
      if (a.type() != type) {
        throw Error(StrCat(where_, ": attribute '", name, "' is of ONNX type ", a.type(),
                           ", expected ", type));
      }
      return &a;
    }
    return nullptr;
  }
  const onnx::NodeProto& n_;
  std::string where_;
  std::set<std::string> read_;
};

}  // namespace cnnflow::onnx_io
