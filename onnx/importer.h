// The ONNX importer's walk over a graph, and the context its converters
// (onnx/converters/) map nodes in: each live node, in order, becomes a
// cnnflow layer (or a constant, or nothing), built as it is mapped so that
// a shape or weight that does not fit is an error naming the ONNX node.
//
// The walk: the initializers are read as constants; the nodes the output
// does not depend on are left out; nodes on constants alone are folded
// (Constant, Identity, a weight's Transpose, a Concat of vectors); patterns
// of several nodes that are one layer (SiLU, GELU in its erf and tanh
// forms: import_patterns.cc) are found; then each remaining node goes to
// the converter registered for its op (onnx/converter.h).
//
// Names: a layer is named after its weight's initializer where that is a
// module path (`layer1.0.conv1.weight` -> layer1.0.conv1), else after the
// node's scope (the TorchScript exporter names nodes
// /layer1/layer1.0/relu/Relu; the newer one records
// pkg.torch.onnx.name_scopes in their metadata).
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "onnx/import.h"
#include "onnx/node_attrs.h"
#include "ops/schema.h"

namespace cnnflow::onnx_io {

// [A-Za-z0-9_-] words joined by single dots: a PyTorch module path.
bool IsModulePath(const std::string& s);
bool EndsWith(const std::string& s, const std::string& suffix);
// Args from a list of ints: omitted when every one is `dflt`, a scalar when
// all are equal, else the list.
void SetInts(Args& args, const std::string& key, const std::vector<int64_t>& v, int64_t dflt);
// A [c, r] f32 matrix from a [r, c] one (a Gemm or MatMul weight [in, out]
// as cnnflow's [out, in]).
Tensor Transposed(const Tensor& w);
// A layer's tensors {weight, and bias where b is given}; without a bias,
// args gets bias: false.
std::vector<std::pair<std::string, Tensor>> WeightAndBias(const Tensor& w, const Tensor* b,
                                                          Args& args);
// Whether layer `type` may read a channels-last view (Val::channels_last).
bool WorksChannelsLast(const std::string& type);

// In a constant that is a shape: the batch size, which a file exported with
// a dynamic batch computes (Shape); and what arithmetic on it gives.
constexpr int64_t kBatchDim = -(int64_t{1} << 40);
constexpr int64_t kUnknownDim = -(int64_t{1} << 41);

// A value the imported layers compute.
struct Val {
  std::string layer;  // the layer that writes it; "input": the model's input
  Shape shape;        // per sample
  // The ONNX value is the layer's output transposed to channels-last,
  // [N, H, W, C] for shape [C, H, W] (ConvNeXt's x.permute(0, 2, 3, 1)):
  // only layers that work on either layout read it (AddLayer checks).
  bool channels_last = false;
};

// kernel, strides, pads, dilations of a Conv, ConvTranspose or pooling node.
struct Window {
  std::vector<int64_t> kernel, stride, pad, dilation;
};

class OnnxImporter {
 public:
  OnnxImporter(const onnx::ModelProto& m, std::string what);
  ImportedOnnx Run();

  // ---- the graph, for converters
  const onnx::NodeProto& node(int i) const { return g_.node(i); }
  // "model.onnx: node '/layer1/Conv' (Conv)", for errors.
  std::string Where(int i) const;
  [[noreturn]] void Fail(int i, const std::string& msg) const;
  // Input k of node i (its name), failing when absent.
  const std::string& In(int i, int k) const;
  bool HasIn(int i, int k) const;
  bool IsConst(const std::string& v) const { return consts_.count(v) != 0; }
  const Tensor& Const(const std::string& v) const { return consts_.at(v); }
  // Input k as a constant, failing when it is not one.
  const Tensor& ConstIn(int i, int k) const;
  // Input k as a computed value, failing when it is not one.
  const Val& ValIn(int i, int k) const;
  bool HasValue(const std::string& v) const { return vals_.count(v) != 0; }
  const Val& Value(const std::string& v) const { return vals_.at(v); }
  // A scalar constant input, or nullopt.
  std::optional<double> ScalarIn(int i, int k) const;
  // Whether a live node reads `v`.
  bool IsRead(const std::string& v) const { return readers_.count(v) != 0; }
  // The one live node that reads `v`, or -1 (none, several, or the graph's output).
  int SoleReader(const std::string& v) const;
  bool IsOp(int i, const char* op) const { return i >= 0 && g_.node(i).op_type() == op; }
  // An elementwise op of two inputs and an output (what the patterns read).
  bool IsBinary(int i, const char* op) const;
  // The node that writes `v`, or -1.
  int Producer(const std::string& v) const;
  // Whether node f flattens samples of `sample` shape, [N, ...] to [N, -1].
  bool IsFlatten(int f, const Shape& sample) const;
  // The window of node i over `s` spatial axes of input `x`; pads must be
  // the same at both ends of each axis. `kernel_from_weight`: the kernel a
  // weight implies (empty: read it from kernel_shape).
  Window ReadWindow(int i, NodeAttrs& a, size_t s, const std::vector<int64_t>& kernel_from_weight,
                    const Shape& x) const;
  const std::string& output() const { return output_; }
  // Whether `d`, a Reshape's first target dimension, keeps the batch: 0
  // (copy), -1 (infer), the symbolic kBatchDim (x.size(0)), or the input's
  // batch size where it is fixed.
  bool IsBatchDim(int64_t d) const {
    return d == 0 || d == -1 || d == kBatchDim || (batch_ > 0 && d == batch_);
  }

  // ---- what converters add
  // Adds a layer of `type` reading `inputs` (values), with its tensors by
  // local name, and builds it: the shapes and every tensor are checked
  // here, so an error names the ONNX node. `output` is the value it writes.
  void AddLayer(int i, const std::string& base, const std::string& type, const Args& args,
                const std::vector<std::string>& inputs,
                std::vector<std::pair<std::string, Tensor>> tensors, const std::string& output);
  // One input (default: the node's first), no tensors, the node's own scope as the name.
  void Simple(int i, const std::string& type, const Args& args = Args(), const std::string& x = "");
  // Node i's output is `from` (a value or a constant) under another name.
  void Alias(int i, const std::string& from);
  // Node i's output is value `from` seen channels-last (or back).
  void AliasLayout(int i, const std::string& from, bool channels_last);
  void SetConst(const std::string& v, Tensor t) { consts_[v] = std::move(t); }
  // Node j is part of the layer being added: it is not converted itself.
  void Skip(int j) { skip_.insert(j); }
  // The graph's output is `v` (a final Softmax dropped).
  void SetOutput(const std::string& v) { output_ = v; }
  void Note(std::string note) { out_.notes.push_back(std::move(note)); }

  // ---- names
  // The name of a parameter-free layer (or one whose weights are not
  // PyTorch's): its scope's module path, else the op in lower case.
  std::string ScopeName(int i) const;
  // A layer's name from the initializer of its tensor `local`
  // ("layer1.0.conv1.weight" -> "layer1.0.conv1"), else from its scope.
  std::string WeightName(int i, int k, const std::string& local) const;

 private:
  // A pattern of several nodes that is one layer: emitted at its last node
  // (`anchor`), which writes the pattern's output; the others are skipped.
  struct Fused {
    std::string type;
    Args args;
    std::string x;  // the value it reads
    Shape x_shape;  // what x must be per sample; empty: any
    // Run when the anchor is converted, once the constants the pattern
    // reads are folded: fills args and x_shape, or fails naming the node.
    std::function<void(int anchor, Fused& f)> resolve;
  };

  void ReadInput();
  void MarkLive();
  // import_constants.cc: whether node i computes a constant from constants
  // alone; if so, its output joins the constants.
  bool FoldConstant(int i);
  std::optional<Tensor> FoldUnsqueeze(int i, NodeAttrs& a);
  std::optional<Tensor> FoldConcat(int i, NodeAttrs& a);
  std::optional<Tensor> FoldGather(int i, NodeAttrs& a);
  std::optional<Tensor> FoldArithmetic(int i);
  void Convert(int i);
  std::string UniqueName(int i, const std::string& base, bool has_params);
  // import_patterns.cc
  void FindPatterns();
  void MatchGeluErf(int erf);
  void MatchGeluTanh(int t);
  void MatchChannelShuffle(int t);
  void ResolveChannelShuffle(int anchor, int r1, size_t rank, Fused& f);
  bool IsCube(const std::string& v, const std::string& x, std::vector<int>* nodes) const;
  // `x_shape` (when not empty): the per-sample shape x must have for the
  // nodes to be this layer, checked when it is built.
  void Fuse(int anchor, const std::vector<int>& members, const std::string& type, Args args,
            const std::string& x, const Shape& x_shape = Shape(),
            std::function<void(int, Fused&)> resolve = nullptr);

  const onnx::ModelProto& m_;
  const onnx::GraphProto& g_;
  std::string what_;
  int opset_ = 0;
  int64_t batch_ = -2;  // the input's batch size when fixed (a Reshape may name it)
  std::string output_;
  std::map<std::string, Tensor> consts_;
  std::map<std::string, Val> vals_;
  std::map<std::string, std::vector<int>> readers_;
  std::map<std::string, int> producer_;
  std::vector<bool> live_;
  std::map<int, Fused> fused_;
  std::set<int> skip_;
  std::set<std::string> reserved_, used_, with_weights_;
  ImportedOnnx out_;
};

}  // namespace cnnflow::onnx_io
