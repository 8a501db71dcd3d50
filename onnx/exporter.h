// The ONNX exporter's context: the model's layers in order, each written by
// the export converter registered for its type (onnx/converter.h) as one
// node or a few, its output named after the layer (the last one "logits"),
// its weights as initializers under their state_dict names. The batch
// dimension is symbolic ("N"). A ReLU cnnflow fuses into the layer before
// is still its own Relu node: fusion is only how the CPU runs it.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/error.h"
#include "ops/model.h"

namespace cnnflow::onnx_io {

class OnnxExporter {
 public:
  OnnxExporter(const Model& model, const std::string& name);
  // Every layer's nodes, the input and the output: the unchecked model.
  onnx::ModelProto Build();

  // ---- the model, for converters
  const Layer& layer(int i) const { return model_.layer(i); }
  // The value layer i writes: its name, "logits" for the last layer, or
  // "<layer>/output" where a tensor of the layer has the layer's name.
  std::string Out(int i) const;
  // The value input k of layer i reads ("input": the model's input).
  std::string In(int i, int k = 0) const;
  // The sample shape of input k of layer i.
  Shape InShape(int i, int k = 0) const;
  int num_inputs(int i) const { return static_cast<int>(model_.inputs_of(i).size()); }

  // ---- what converters add
  // A node of layer i named after the layer (+ suffix), writing `output`.
  onnx::NodeProto* Node(const std::string& op, int i, std::vector<std::string> inputs,
                        const std::string& output, const std::string& suffix = "");
  // One node of a layer made of several: its output "<layer>/<tag>"
  // (`last`: the layer's output).
  std::string Step(int i, const char* op, std::vector<std::string> in, const std::string& tag,
                   bool last = false);
  // The layer's parameter or buffer `local` as an initializer; its name.
  std::string Weight(const Layer& l, const std::string& local);
  // The layer's weight and bias, or ones and zeros without an affine map.
  std::pair<std::string, std::string> AffineOrIdentity(const Layer& l, bool affine,
                                                       int64_t channels);
  // An initializer named `name` from a host f32 (or f64, cast) tensor.
  void AddInitializer(const std::string& name, const Tensor& value);
  void AddFilled(const std::string& name, int64_t n, float v);
  // A 1D int64 initializer (Reshape's shape, Unsqueeze's axes).
  void AddInts(const std::string& name, const std::vector<int64_t>& v);
  // A scalar (0-d) f32 initializer (Clip's bounds must be 0-d); its name.
  std::string Scalar(const std::string& name, float v);
  // `value` (a tensor of rank `rank`, with the batch dimension if it has
  // one) with axes [rank, rank + extra) of size 1 appended; its name.
  std::string Unsqueezed(int i, const std::string& value, int rank, int extra,
                         const std::string& suffix);

  // Layer i as its class `T` (a layer split over devices is not).
  template <typename T>
  const T& As(int i) const {
    const auto* t = dynamic_cast<const T*>(&model_.layer(i));
    if (t == nullptr) {
      throw Error(StrCat("layer '", model_.layer(i).name(), "' (", model_.layer(i).type(),
                         ") is not the unsplit layer ONNX export reads (a tensor-parallel "
                         "shard?); export the run's weights with `cnnflow export`"));
    }
    return *t;
  }

  // Attributes.
  static void Ints(onnx::NodeProto* n, const char* name, std::vector<int64_t> v);
  static onnx::NodeProto* Int(onnx::NodeProto* n, const char* name, int64_t v);
  static onnx::NodeProto* Float(onnx::NodeProto* n, const char* name, float v);
  static void Str(onnx::NodeProto* n, const char* name, const std::string& v);

 private:
  // The layer that input k of layer i reads (-1: the model input).
  int Source(int i, int k) const;
  void AddLayer(int i);

  const Model& model_;
  onnx::ModelProto proto_;
  onnx::GraphProto* graph_ = nullptr;
};

}  // namespace cnnflow::onnx_io
