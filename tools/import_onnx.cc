// ONNX in: each node (or each pattern an exporter writes for one PyTorch
// module) becomes one cnnflow layer, built as it is mapped:
//   Conv                      conv2d / conv1d (symmetric pads; auto_pad where it is)
//   ConvTranspose             conv_transpose2d
//   BatchNormalization        batchnorm (momentum 1 - ONNX's; inference or training mode)
//   Gemm, MatMul (+ Add)      linear (a [in, out] weight transposed)
//   MaxPool, AveragePool      maxpool*d, avgpool*d (ceil_mode only where it changes nothing)
//   GlobalAveragePool         global_avgpool when a Flatten follows, else adaptive_avgpool*d {out:
//   1} ReduceMean (spatial)      the same Flatten, Reshape [N, -1]  flatten (nothing when the
//   sample is flat already) Relu, LeakyRelu, Sigmoid, Tanh, HardSigmoid, HardSwish, Gelu   the
//   layer of that name Clip [0, 6] / [0, inf)    relu6 / relu Sigmoid + Mul(x, .)       silu
//   (torch.onnx's SiLU) Div(x, sqrt 2), Erf, Add 1, Mul x, Mul 0.5   gelu (torch.onnx's exact GELU)
//   the tanh form's chain     gelu {approximate: tanh}
//   Add, Mul, Concat          add, mul, concat of computed values; Mul by a
//                             scalar: mul {scale}; by a [C, 1, 1] tensor: layer_scale
//   Div by a scalar           mul {scale: 1 / c}
//   Dropout                   dropout (p > 0) or nothing;  Identity  nothing
//   Resize                    upsample (nearest as PyTorch's, bilinear)
//   a final Softmax           dropped (cnnflow's loss and predict apply it), said in a note
// Squeeze-excitation needs no pattern of its own: GlobalAveragePool, Conv,
// Sigmoid and Mul map one to one onto its layers. Constants (initializers,
// Constant nodes, and Identity, a 2-D Transpose or a vector Concat of them)
// are weights or attributes; a layer is named after its weight's initializer
// where that is a module path (`layer1.0.conv1.weight` -> layer1.0.conv1),
// else after the node's scope (the TorchScript exporter names nodes
// /layer1/layer1.0/relu/Relu; the newer one records
// pkg.torch.onnx.name_scopes in their metadata). Nodes the output does not
// depend on are left out.
#include "tools/import_onnx.h"

#include <google/protobuf/unknown_field_set.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "ops/error.h"
#include "ops/io/file_write.h"
#include "ops/io/safetensors.h"
#include "ops/layer.h"
#include "pipeline/model_blocks.h"
#include "pipeline/run_config.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

constexpr const char* kImportUsage =
    R"(usage: cnnflow import MODEL.onnx -o DIR [--name NAME] [--mean m,m,m --std s,s,s]

  MODEL.onnx      an ONNX model of one input [N, C, H, W] or [N, C, L] and one output
                  [N, classes]; from PyTorch: torch.onnx.export(model.eval(), x, path,
                  dynamo=False, training=torch.onnx.TrainingMode.PRESERVE,
                  do_constant_folding=False) keeps BatchNormalization as nodes (trainable)
  -o DIR          a new folder: DIR/model.yaml (a run config: the network, a synthetic
                  placeholder data section, a minimal train section) and
                  DIR/model.safetensors (the weights, by PyTorch's names where ONNX has them);
                  written whole or not at all
  --name NAME     the run's name (default: the graph's, else the file's stem)
  --mean, --std   the normalisation the network was trained with, per channel
                  (ImageNet's: 0.485,0.456,0.406 and 0.229,0.224,0.225); a normalize
                  transform in model.yaml (default: none)
)";

struct UsageError : Error {
  using Error::Error;
};

// ------------------------------------------------------------------ tensors

// The ONNX TensorProto data types the importer reads.
enum OnnxType : int {
  kFloat = 1,
  kInt32 = 6,
  kInt64 = 7,
  kFloat16 = 10,
  kDouble = 11,
  kBFloat16 = 16
};

// A TensorProto as a host tensor: floating types as f32, integers as i64.
// Every size is checked against the bytes present before anything is
// allocated, so a hostile file cannot ask for more memory than it holds.
Tensor ReadTensor(const onnx::TensorProto& t, const std::string& where) {
  if (t.data_location() == onnx::TensorProto_DataLocation_EXTERNAL) {
    throw Error(StrCat(where, ": tensor '", t.name(),
                       "' is stored in an external file; save the model with its weights "
                       "inside (onnx.save_model(m, path, save_as_external_data=False))"));
  }
  if (t.dims_size() > 8)
    throw Error(StrCat(where, ": tensor '", t.name(), "' has ", t.dims_size(), " dimensions"));
  std::vector<int64_t> dims;
  int64_t n = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || d > (int64_t{1} << 32))
      throw Error(StrCat(where, ": tensor '", t.name(), "' has dimension ", d));
    n *= d;
    if (n > (int64_t{1} << 34))
      throw Error(StrCat(where, ": tensor '", t.name(), "' is too large"));
    dims.push_back(d);
  }
  const Shape shape = dims.empty() ? Shape{1} : Shape(dims);
  const size_t raw = t.raw_data().size();
  const bool has_raw = t.has_raw_data();
  auto bad_size = [&](int64_t have, const char* unit) {
    return Error(StrCat(where, ": tensor '", t.name(), "' ", shape, " holds ", have, " ", unit,
                        ", expected ", n));
  };
  auto from_raw = [&](DType dtype) {
    const size_t es = DTypeSize(dtype);
    if (raw != static_cast<size_t>(n) * es)
      throw bad_size(static_cast<int64_t>(raw / es), "values");
    Tensor out = Tensor::Empty(shape, dtype);
    if (n > 0) std::memcpy(out.raw_data(), t.raw_data().data(), raw);  // little-endian, as ONNX
    return out;
  };
  switch (t.data_type()) {
    case kFloat: {
      if (has_raw) return from_raw(DType::kF32);
      if (t.float_data_size() != n) throw bad_size(t.float_data_size(), "floats");
      Tensor out = Tensor::Empty(shape, DType::kF32);
      std::copy(t.float_data().begin(), t.float_data().end(), out.data<float>());
      return out;
    }
    case kDouble: {
      if (has_raw) return from_raw(DType::kF64).Cast(DType::kF32);
      if (t.double_data_size() != n) throw bad_size(t.double_data_size(), "doubles");
      Tensor out = Tensor::Empty(shape, DType::kF32);
      std::copy(t.double_data().begin(), t.double_data().end(), out.data<float>());
      return out;
    }
    case kFloat16:
    case kBFloat16: {
      const DType half = t.data_type() == kFloat16 ? DType::kF16 : DType::kBF16;
      if (has_raw) return from_raw(half).Cast(DType::kF32);
      if (t.int32_data_size() != n) throw bad_size(t.int32_data_size(), "values");
      Tensor h = Tensor::Empty(shape, half);
      auto* bits = static_cast<uint16_t*>(h.raw_data());
      for (int64_t i = 0; i < n; ++i)
        bits[i] = static_cast<uint16_t>(t.int32_data(static_cast<int>(i)));
      return h.Cast(DType::kF32);
    }
    case kInt64: {
      if (has_raw) return from_raw(DType::kI64);
      if (t.int64_data_size() != n) throw bad_size(t.int64_data_size(), "integers");
      Tensor out = Tensor::Empty(shape, DType::kI64);
      std::copy(t.int64_data().begin(), t.int64_data().end(), out.data<int64_t>());
      return out;
    }
    case kInt32: {
      Tensor out = Tensor::Empty(shape, DType::kI64);
      if (has_raw) {
        if (raw != static_cast<size_t>(n) * 4)
          throw bad_size(static_cast<int64_t>(raw / 4), "integers");
        for (int64_t i = 0; i < n; ++i) {
          int32_t v;
          std::memcpy(&v, t.raw_data().data() + 4 * i, 4);
          out.data<int64_t>()[i] = v;
        }
      } else {
        if (t.int32_data_size() != n) throw bad_size(t.int32_data_size(), "integers");
        std::copy(t.int32_data().begin(), t.int32_data().end(), out.data<int64_t>());
      }
      return out;
    }
    default:
      throw Error(StrCat(where, ": tensor '", t.name(), "' has ONNX data type ", t.data_type(),
                         " (the importer reads float, double, float16, bfloat16, int32, int64)"));
  }
}

std::vector<int64_t> IntsOf(const Tensor& t) {
  std::vector<int64_t> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = static_cast<int64_t>(t.At(i));
  return v;
}

// A float attribute as the double it was written from (0.1f -> 0.1, not
// 0.10000000149): the shortest decimal that reads back as the same float.
double Decimal(float f) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, f);
  return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

// [A-Za-z0-9_] words joined by single dots: a PyTorch module path.
bool IsModulePath(const std::string& s) {
  if (s.empty() || s.front() == '.' || s.back() == '.') return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '.' && s[i + 1] == '.') return false;
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) return false;
  }
  return true;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Args from a list of ints: omitted when every one is `dflt`, a scalar when
// all are equal, else the list.
void SetInts(Args& args, const std::string& key, const std::vector<int64_t>& v, int64_t dflt) {
  if (std::all_of(v.begin(), v.end(), [&](int64_t x) { return x == dflt; })) return;
  if (std::all_of(v.begin(), v.end(), [&](int64_t x) { return x == v[0]; })) {
    args.Set(key, v[0]);
  } else {
    args.Set(key, v);
  }
}

// ---------------------------------------------------------------- attributes

// A node's attributes, each read once by name and type; Done() fails for
// any the mapping did not read (an attribute cnnflow has no counterpart
// for is an error, never silently dropped).
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

// ------------------------------------------------------------------ importer

// A value the imported layers compute.
struct Val {
  std::string layer;  // the layer that writes it; "input": the model's input
  Shape shape;        // per sample
};

// A pattern of several nodes that is one layer: emitted at its last node
// (`anchor`), which writes the pattern's output; the others are skipped.
struct Fused {
  std::string type;
  Args args;
  std::string x;  // the value it reads
};

const std::vector<std::string>& KnownOps() {
  static const std::vector<std::string> ops = {"Add",
                                               "AveragePool",
                                               "BatchNormalization",
                                               "Clip",
                                               "Concat",
                                               "Constant",
                                               "Conv",
                                               "ConvTranspose",
                                               "Div",
                                               "Dropout",
                                               "Erf (in GELU)",
                                               "Flatten",
                                               "Gelu",
                                               "Gemm",
                                               "GlobalAveragePool",
                                               "HardSigmoid",
                                               "HardSwish",
                                               "Identity",
                                               "LeakyRelu",
                                               "LogSoftmax (last)",
                                               "MatMul",
                                               "MaxPool",
                                               "Mul",
                                               "ReduceMean",
                                               "Relu",
                                               "Reshape",
                                               "Resize",
                                               "Sigmoid",
                                               "Softmax (last)",
                                               "Tanh",
                                               "Transpose (of a constant)"};
  return ops;
}

class OnnxImporter {
 public:
  OnnxImporter(const onnx::ModelProto& m, std::string what)
      : m_(m), g_(m.graph()), what_(std::move(what)) {
    for (const auto& op : m.opset_import())
      if (op.domain().empty() || op.domain() == "ai.onnx") opset_ = static_cast<int>(op.version());
  }

  ImportedOnnx Run() {
    out_.onnx_nodes = g_.node_size();
    out_.source = StrCat(m_.producer_name().empty() ? "unknown producer" : m_.producer_name(),
                         m_.producer_version().empty() ? "" : " " + m_.producer_version(),
                         ", opset ", opset_);
    out_.name = g_.name();
    for (const auto& t : g_.initializer()) {
      if (consts_.count(t.name()))
        throw Error(StrCat(what_, ": two initializers named '", t.name(), "'"));
      consts_.emplace(t.name(), ReadTensor(t, what_));
    }
    ReadInput();
    if (g_.output_size() != 1) {
      throw Error(StrCat(what_, ": the graph has ", g_.output_size(),
                         " outputs; cnnflow imports models of one output [N, classes]"));
    }
    output_ = g_.output(0).name();
    MarkLive();
    for (int i = 0; i < g_.node_size(); ++i) {
      if (!live_[i]) continue;
      for (const auto& v : g_.node(i).input())
        if (!v.empty()) readers_[v].push_back(i);
    }
    // Parameterised layers take their weights' module paths; the others
    // keep clear of them.
    for (const auto& [name, t] : consts_) {
      const size_t dot = name.rfind('.');
      if (IsModulePath(name) && dot != std::string::npos) reserved_.insert(name.substr(0, dot));
    }
    reserved_.insert("input");
    // Constants first (the patterns compare them): Constant nodes, and the
    // few ops exporters apply to constants (Identity aliases, a weight's
    // Transpose, Resize's scales put together by Concat).
    for (int i = 0; i < g_.node_size(); ++i) {
      if (live_[i] && FoldConstant(i)) skip_.insert(i);
    }
    FindPatterns();
    for (int i = 0; i < g_.node_size(); ++i) {
      if (live_[i] && !skip_.count(i)) Convert(i);
    }
    auto it = vals_.find(output_);
    if (it == vals_.end()) {
      throw Error(
          StrCat(what_, ": the output '", output_, "' is not computed from the input by layers"));
    }
    if (out_.layers.empty() || it->second.layer != out_.layers.back().name) {
      throw Error(StrCat(what_, ": the output '", output_, "' is not the last layer's"));
    }
    if (it->second.shape.rank() != 1) {
      throw Error(StrCat(what_, ": the output is ", it->second.shape.WithBatch(-1),
                         " per batch; cnnflow trains classifiers, [N, classes]"));
    }
    out_.classes = it->second.shape[0];
    return std::move(out_);
  }

 private:
  // ---- the graph's input, what the output needs, who reads what

  void ReadInput() {
    const onnx::ValueInfoProto* in = nullptr;
    for (const auto& v : g_.input()) {
      if (consts_.count(v.name())) continue;  // IR < 4 lists initializers as inputs
      if (in != nullptr) {
        throw Error(StrCat(what_, ": the graph has inputs '", in->name(), "' and '", v.name(),
                           "'; cnnflow imports models of one input"));
      }
      in = &v;
    }
    if (in == nullptr) throw Error(StrCat(what_, ": the graph has no input"));
    const auto& type = in->type();
    if (!type.has_tensor_type() || type.tensor_type().elem_type() != kFloat) {
      throw Error(StrCat(what_, ": input '", in->name(), "' is not a float tensor"));
    }
    const auto& s = type.tensor_type().shape();
    std::vector<int64_t> dims;
    bool fixed = s.dim_size() == 3 || s.dim_size() == 4;
    for (int d = 1; d < s.dim_size() && fixed; ++d) {
      fixed =
          s.dim(d).has_dim_value() && s.dim(d).dim_value() > 0 && s.dim(d).dim_value() <= (1 << 20);
      if (fixed) dims.push_back(s.dim(d).dim_value());
    }
    if (!fixed) {
      throw Error(StrCat(what_, ": input '", in->name(), "' has ", s.dim_size(),
                         " dimensions of which not all but the first are fixed; cnnflow takes "
                         "[N, C, H, W] or [N, C, L] with fixed C, H, W (export with a sample input "
                         "of the size to train at)"));
    }
    if (s.dim(0).has_dim_value()) batch_ = s.dim(0).dim_value();
    out_.input_shape = Shape(dims);
    if (out_.input_shape.numel() > (int64_t{1} << 28)) {
      throw Error(
          StrCat(what_, ": input '", in->name(), "' ", out_.input_shape, " is too large a sample"));
    }
    vals_[in->name()] = Val{"input", out_.input_shape};
  }

  // Nodes the output depends on, walked back from it in reverse order (the
  // nodes are in topological order, as ONNX requires).
  void MarkLive() {
    live_.assign(g_.node_size(), false);
    std::map<std::string, int> producer;
    for (int i = 0; i < g_.node_size(); ++i) {
      for (const auto& o : g_.node(i).output()) {
        if (o.empty()) continue;
        if (producer.count(o) || consts_.count(o)) {
          throw Error(StrCat(Where(i), ": its output '", o, "' is written by another node too"));
        }
        producer[o] = i;
      }
    }
    std::set<std::string> needed = {output_};
    for (int i = g_.node_size() - 1; i >= 0; --i) {
      const auto& n = g_.node(i);
      for (const auto& o : n.output()) live_[i] = live_[i] || needed.count(o);
      if (!live_[i]) continue;
      for (const auto& v : n.input()) {
        if (v.empty()) continue;
        if (auto p = producer.find(v); p != producer.end() && p->second >= i) {
          throw Error(
              StrCat(Where(i), ": reads '", v,
                     "', which a later node writes (the nodes are not in topological order)"));
        }
        needed.insert(v);
      }
    }
    producer_ = std::move(producer);
  }

  // Whether node i computes a constant from constants alone; if so, its
  // output joins the constants.
  bool FoldConstant(int i) {
    const auto& n = g_.node(i);
    const std::string& op = n.op_type();
    if (op == "Constant") return Convert(i), true;
    if (n.input_size() == 0 || n.output_size() < 1 || n.output(0).empty()) return false;
    for (const auto& v : n.input())
      if (!v.empty() && !IsConst(v)) return false;
    if (op == "Identity") return Convert(i), true;
    NodeAttrs a(n, Where(i));
    if (op == "Transpose") {
      const Tensor& t = ConstIn(i, 0);
      const std::vector<int64_t> perm = a.Ints("perm", {1, 0});
      a.Done();
      if (t.shape().rank() != 2 || perm != std::vector<int64_t>{1, 0} || t.dtype() != DType::kF32) {
        Fail(i, "transposes a constant other than a 2-D float matrix");
      }
      consts_[n.output(0)] = Transposed(t);
      return true;
    }
    if (op == "Concat") {
      const int64_t axis = a.Int("axis", 0);
      a.Done();
      std::vector<double> v;
      DType dtype = ConstIn(i, 0).dtype();
      for (int k = 0; k < n.input_size(); ++k) {
        const Tensor& t = ConstIn(i, k);
        if (t.shape().rank() != 1 || t.dtype() != dtype || (axis != 0 && axis != -1)) {
          Fail(i, "concatenates constants other than vectors of one type");
        }
        for (int64_t j = 0; j < t.numel(); ++j) v.push_back(t.At(j));
      }
      Tensor out = Tensor::Empty(Shape{static_cast<int64_t>(v.size())}, dtype);
      for (size_t j = 0; j < v.size(); ++j) out.Set(static_cast<int64_t>(j), v[j]);
      consts_[n.output(0)] = out;
      return true;
    }
    return false;
  }

  std::string Where(int i) const {
    const auto& n = g_.node(i);
    return StrCat(what_, ": node ", n.name().empty() ? StrCat("#", i) : StrCat("'", n.name(), "'"),
                  " (", n.op_type(), ")");
  }
  [[noreturn]] void Fail(int i, const std::string& msg) const {
    throw Error(StrCat(Where(i), ": ", msg));
  }

  const std::string& In(int i, int k) const {
    const auto& n = g_.node(i);
    if (k >= n.input_size() || n.input(k).empty()) Fail(i, StrCat("has no input ", k));
    return n.input(k);
  }
  bool HasIn(int i, int k) const {
    return k < g_.node(i).input_size() && !g_.node(i).input(k).empty();
  }
  bool IsConst(const std::string& v) const { return consts_.count(v) != 0; }
  const Tensor& ConstIn(int i, int k) const {
    auto it = consts_.find(In(i, k));
    if (it == consts_.end())
      Fail(i, StrCat("input ", k, " ('", In(i, k), "') must be a constant (an initializer)"));
    return it->second;
  }
  const Val& ValIn(int i, int k) const {
    auto it = vals_.find(In(i, k));
    if (it == vals_.end()) {
      Fail(i, StrCat("input ", k, " ('", In(i, k), "') ",
                     IsConst(In(i, k))
                         ? "is a constant; this op needs a computed value there"
                         : "is not computed from the model's input by the layers before"));
    }
    return it->second;
  }
  // A scalar constant input, or nullopt.
  std::optional<double> ScalarIn(int i, int k) const {
    if (!HasIn(i, k) || !IsConst(In(i, k))) return std::nullopt;
    const Tensor& t = consts_.at(In(i, k));
    if (t.numel() != 1) return std::nullopt;
    return t.At(0);
  }
  // The one live node that reads `v`, or -1 (none, several, or the graph's output).
  int SoleReader(const std::string& v) const {
    if (v == output_) return -1;
    auto it = readers_.find(v);
    return it != readers_.end() && it->second.size() == 1 ? it->second[0] : -1;
  }
  bool IsOp(int i, const char* op) const { return i >= 0 && g_.node(i).op_type() == op; }
  // An elementwise op of two inputs and an output (what the patterns read).
  bool IsBinary(int i, const char* op) const {
    return IsOp(i, op) && g_.node(i).input_size() == 2 && g_.node(i).output_size() >= 1;
  }
  int Producer(const std::string& v) const {
    auto it = producer_.find(v);
    return it == producer_.end() ? -1 : it->second;
  }

  // ---- patterns of several nodes that are one layer

  // A scalar constant close to `want` (exporters write sqrt 2, 0.044715 ... as floats).
  static bool Near(std::optional<double> v, double want) { return v && std::abs(*v - want) < 1e-4; }

  void FindPatterns() {
    for (int i = 0; i < g_.node_size(); ++i) {
      if (!live_[i]) continue;
      const auto& n = g_.node(i);
      // SiLU: Sigmoid(x) read only by Mul(x, Sigmoid(x)).
      if (n.op_type() == "Sigmoid" && n.input_size() == 1 && n.output_size() == 1) {
        const int m = SoleReader(n.output(0));
        if (IsBinary(m, "Mul")) {
          const auto& mi = g_.node(m).input();
          if ((mi[0] == n.input(0) && mi[1] == n.output(0)) ||
              (mi[1] == n.input(0) && mi[0] == n.output(0))) {
            Fuse(m, {i}, "silu", Args(), n.input(0));
          }
        }
      }
      // GELU (erf): Div(x, sqrt 2) or Mul(x, 1/sqrt 2) -> Erf -> Add 1 ->
      // Mul by x and by 0.5, in either order (or x * 0.5 made first).
      if (n.op_type() == "Erf" && n.input_size() == 1 && n.output_size() == 1) {
        const int d = Producer(n.input(0));
        if (d < 0 || SoleReader(n.input(0)) != i || g_.node(d).input_size() != 2) continue;
        const bool scaled = (IsBinary(d, "Div") && Near(ScalarIn(d, 1), std::sqrt(2.0))) ||
                            (IsBinary(d, "Mul") && Near(ScalarIn(d, 1), 1 / std::sqrt(2.0)));
        if (!scaled) continue;
        const std::string& x = g_.node(d).input(0);
        const int p = SoleReader(n.output(0));
        if (!IsBinary(p, "Add") || !(Near(ScalarIn(p, 1), 1) || Near(ScalarIn(p, 0), 1))) continue;
        const int m1 = SoleReader(g_.node(p).output(0));
        if (!IsBinary(m1, "Mul")) continue;
        const auto& a = g_.node(m1).input();
        const std::string& other = a[0] == g_.node(p).output(0) ? a[1] : a[0];
        const int m2 = SoleReader(g_.node(m1).output(0));
        auto mul_of = [&](int m, const std::string& v, auto pred) {
          if (!IsBinary(m, "Mul")) return false;
          const auto& b = g_.node(m).input();
          return (b[0] == v && pred(1)) || (b[1] == v && pred(0));
        };
        Args args;
        if (other == x &&
            mul_of(m2, g_.node(m1).output(0), [&](int k) { return Near(ScalarIn(m2, k), 0.5); })) {
          Fuse(m2, {d, i, p, m1}, "gelu", args, x);
        } else if (Near(ScalarIn(m1, a[0] == other ? 0 : 1), 0.5) &&
                   mul_of(m2, g_.node(m1).output(0),
                          [&](int k) { return g_.node(m2).input(k) == x; })) {
          Fuse(m2, {d, i, p, m1}, "gelu", args, x);
        } else if (const int h = Producer(other);
                   h >= 0 && SoleReader(other) == m1 &&
                   mul_of(h, x, [&](int k) { return Near(ScalarIn(h, k), 0.5); })) {
          Fuse(m1, {h, d, i, p}, "gelu", args, x);
        }
      }
      // GELU (tanh): x * 0.5 * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))),
      // found from its Tanh: walked back to x, forward to the end.
      if (n.op_type() == "Tanh" && n.input_size() == 1 && n.output_size() == 1) MatchGeluTanh(i);
    }
  }

  // The tanh form as torch.onnx writes F.gelu(x, approximate='tanh'):
  //   Mul(x, x) -> Mul(., x) | Pow(x, 3);  Mul(., 0.044715);  Add(x, .);
  //   Mul(., sqrt(2/pi));  Tanh;  Add(., 1);  Mul(x * 0.5 | x, .) ...
  // matched by the values it computes rather than a node order: the
  // members are every node between x and the end that only this chain
  // reads.
  void MatchGeluTanh(int t) {
    std::vector<int> members;
    // Backwards: Tanh <- Mul(c, sqrt(2/pi)) <- Add(x, cube * 0.044715).
    const int s = Producer(g_.node(t).input(0));
    if (!IsBinary(s, "Mul") || SoleReader(g_.node(s).output(0)) != t) return;
    int sk = Near(ScalarIn(s, 1), std::sqrt(2 / M_PI))   ? 0
             : Near(ScalarIn(s, 0), std::sqrt(2 / M_PI)) ? 1
                                                         : -1;
    if (sk < 0) return;
    const int a = Producer(g_.node(s).input(sk));
    if (!IsBinary(a, "Add") || SoleReader(g_.node(a).output(0)) != s) return;
    // One side of the Add is x, the other 0.044715 * x^3.
    for (int xi = 0; xi < 2; ++xi) {
      const std::string& x = g_.node(a).input(xi);
      const std::string& cube_scaled = g_.node(a).input(1 - xi);
      const int c = Producer(cube_scaled);
      if (!IsBinary(c, "Mul") || SoleReader(cube_scaled) != a) continue;
      const int ck = Near(ScalarIn(c, 1), 0.044715) ? 0 : Near(ScalarIn(c, 0), 0.044715) ? 1 : -1;
      if (ck < 0) continue;
      const std::string& cube = g_.node(c).input(ck);
      std::vector<int> cube_nodes;
      if (!IsCube(cube, x, &cube_nodes)) continue;
      members = cube_nodes;
      members.insert(members.end(), {c, a, s, t});
      // Forwards: Add(tanh, 1), then the products with x and 0.5.
      const int p = SoleReader(g_.node(t).output(0));
      if (!IsBinary(p, "Add") || !(Near(ScalarIn(p, 1), 1) || Near(ScalarIn(p, 0), 1))) return;
      members.push_back(p);
      // The rest multiplies (1 + tanh) by x and by 0.5: either 0.5 * x made
      // first (a Mul of x, read only here) or two Muls after.
      const int m1 = SoleReader(g_.node(p).output(0));
      if (!IsBinary(m1, "Mul")) return;
      const auto& mi = g_.node(m1).input();
      const std::string& other = mi[0] == g_.node(p).output(0) ? mi[1] : mi[0];
      const int h = Producer(other);
      if (IsBinary(h, "Mul") && SoleReader(other) == m1 &&
          ((g_.node(h).input(0) == x && Near(ScalarIn(h, 1), 0.5)) ||
           (g_.node(h).input(1) == x && Near(ScalarIn(h, 0), 0.5)))) {
        members.push_back(h);
        Args args;
        args.Set("approximate", std::string("tanh"));
        return Fuse(m1, members, "gelu", args, x);
      }
      const int m2 = SoleReader(g_.node(m1).output(0));
      if (!IsBinary(m2, "Mul")) return;
      const auto& m2i = g_.node(m2).input();
      const std::string& last = m2i[0] == g_.node(m1).output(0) ? m2i[1] : m2i[0];
      const bool x_then_half =
          other == x && IsConst(last) && Near(ScalarIn(m2, m2i[0] == last ? 0 : 1), 0.5);
      const bool half_then_x =
          IsConst(other) && Near(ScalarIn(m1, mi[0] == other ? 0 : 1), 0.5) && last == x;
      if (!x_then_half && !half_then_x) return;
      members.push_back(m1);
      Args args;
      args.Set("approximate", std::string("tanh"));
      return Fuse(m2, members, "gelu", args, x);
    }
  }

  // Whether `v` is x^3 (Pow(x, 3), or Mul(Mul(x, x), x) in any order),
  // computed only for this chain; its nodes go to `nodes`.
  bool IsCube(const std::string& v, const std::string& x, std::vector<int>* nodes) const {
    const int c = Producer(v);
    if (c < 0 || g_.node(c).input_size() != 2) return false;
    const auto& in = g_.node(c).input();
    if (IsBinary(c, "Pow")) {
      const auto e = ScalarIn(c, 1);
      if (in[0] != x || !e || *e != 3) return false;
      nodes->push_back(c);
      return true;
    }
    if (!IsBinary(c, "Mul")) return false;
    for (int k = 0; k < 2; ++k) {
      if (in[k] != x) continue;
      const int sq = Producer(in[1 - k]);
      if (IsBinary(sq, "Mul") && SoleReader(in[1 - k]) == c && g_.node(sq).input(0) == x &&
          g_.node(sq).input_size() == 2 && g_.node(sq).input(1) == x) {
        nodes->insert(nodes->end(), {sq, c});
        return true;
      }
    }
    return false;
  }

  void Fuse(int anchor, const std::vector<int>& members, const std::string& type, Args args,
            const std::string& x) {
    if (fused_.count(anchor) || skip_.count(anchor)) return;
    for (int m : members)
      if (skip_.count(m) || fused_.count(m)) return;
    fused_[anchor] = Fused{type, std::move(args), x};
    skip_.insert(members.begin(), members.end());
  }

  // ---- names

  // The module path of a node's scope: torch.onnx names a node
  // "/layer1/layer1.0/conv1/Conv", each part a module's name as its parent
  // knows it, prefixed by the parent's when it is a list item
  // ("features.1", then "features.1.0"); "" when the name is not of that form.
  static std::string ScopePath(const std::string& node_name) {
    if (node_name.empty() || node_name[0] != '/') return "";
    std::vector<std::string> parts;
    std::stringstream ss(node_name.substr(1));
    for (std::string p; std::getline(ss, p, '/');) parts.push_back(p);
    if (parts.size() < 2) return "";
    parts.pop_back();  // the op
    std::string path, prev;
    for (const std::string& p : parts) {
      const std::string rel =
          !prev.empty() && p.rfind(prev + ".", 0) == 0 ? p.substr(prev.size() + 1) : p;
      path += (path.empty() ? "" : ".") + rel;
      prev = p;
    }
    return IsModulePath(path) ? path : "";
  }

  // The module path torch.onnx's newer exporter (dynamo=True) records in a
  // node's metadata: pkg.torch.onnx.name_scopes = "['', 'layer1',
  // 'layer1.0', 'layer1.0.relu', 'relu']", the module's path next to last.
  // NodeProto.metadata_props (field 9, ONNX 1.16) is newer than Debian's
  // ONNX classes, so it is read from the fields they keep unparsed.
  static std::string MetadataScope(const onnx::NodeProto& n) {
    constexpr int kMetadataProps = 9;
    const google::protobuf::UnknownFieldSet& unknown = n.GetReflection()->GetUnknownFields(n);
    for (int f = 0; f < unknown.field_count(); ++f) {
      if (unknown.field(f).number() != kMetadataProps ||
          unknown.field(f).type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
        continue;
      }
      onnx::StringStringEntryProto p;
      if (!p.ParseFromString(unknown.field(f).length_delimited()) ||
          p.key() != "pkg.torch.onnx.name_scopes") {
        continue;
      }
      std::vector<std::string> scopes;
      for (size_t q = p.value().find('\''); q != std::string::npos;) {
        const size_t e = p.value().find('\'', q + 1);
        if (e == std::string::npos) break;
        scopes.push_back(p.value().substr(q + 1, e - q - 1));
        q = p.value().find('\'', e + 1);
      }
      if (scopes.size() >= 3 && IsModulePath(scopes[scopes.size() - 2]))
        return scopes[scopes.size() - 2];
    }
    return "";
  }

  // The name of a parameter-free layer (or one whose weights are not
  // PyTorch's): its scope's module path, else the op in lower case.
  std::string ScopeName(int i) const {
    std::string s = ScopePath(g_.node(i).name());
    if (s.empty()) s = MetadataScope(g_.node(i));
    if (s.empty()) {
      for (char c : g_.node(i).op_type())
        s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (!IsModulePath(s)) s = "layer";
    }
    return s;
  }

  // A layer's name from the initializer of its tensor `local`
  // ("layer1.0.conv1.weight" -> "layer1.0.conv1"), else from its scope.
  std::string WeightName(int i, int k, const std::string& local) const {
    const std::string& v = In(i, k);
    if (IsModulePath(v) && EndsWith(v, "." + local))
      return v.substr(0, v.size() - local.size() - 1);
    return ScopeName(i);
  }

  std::string UniqueName(int i, const std::string& base, bool has_params) {
    std::string name = base;
    for (int k = 1; used_.count(name) || (!has_params && reserved_.count(name)); ++k)
      name = StrCat(base, "_", k);
    if (has_params && with_weights_.count(base)) {
      out_.notes.push_back(StrCat(Where(i), ": uses the weights of layer '", base,
                                  "' again; layer '", name,
                                  "' gets a copy of its own (they train apart)"));
    }
    used_.insert(name);
    if (has_params) with_weights_.insert(name);
    return name;
  }

  // ---- layers

  // Adds a layer of `type` reading `inputs` (values), with its tensors by
  // local name, and builds it: the shapes and every tensor are checked
  // here, so an error names the ONNX node.
  void AddLayer(int i, const std::string& base, const std::string& type, const Args& args,
                const std::vector<std::string>& inputs,
                std::vector<std::pair<std::string, Tensor>> tensors, const std::string& output) {
    const LayerType* lt = LayerRegistry::Get().Find(type);
    CNNFLOW_ENFORCE(lt != nullptr, "no layer type ", type);
    LayerSpec spec;
    spec.name = UniqueName(i, base, !tensors.empty());
    spec.type = type;
    spec.args = args;
    std::vector<Shape> shapes;
    for (const std::string& v : inputs) {
      auto it = vals_.find(v);
      if (it == vals_.end()) Fail(i, StrCat("reads '", v, "', which no layer before computes"));
      const Val& val = it->second;
      spec.inputs.push_back(val.layer);
      shapes.push_back(val.shape);
    }
    const std::string previous = out_.layers.empty() ? "input" : out_.layers.back().name;
    if (spec.inputs.size() == 1 && spec.inputs[0] == previous) spec.inputs.clear();
    Args full = args;
    full.FillDefaults(lt->schema);
    std::unique_ptr<Layer> layer;
    Shape out;
    try {
      layer = lt->create(spec.name, full);
      out = layer->Build(shapes, DType::kF32);
    } catch (const Error& e) {
      Fail(i, StrCat("as cnnflow ", type, " '", spec.name, "': ", e.what()));
    }
    std::map<std::string, Tensor> given(tensors.begin(), tensors.end());
    auto take = [&](const std::string& local, const Tensor& want) {
      auto it = given.find(local);
      if (it == given.end())
        Fail(i, StrCat("gives no '", local, "' for cnnflow ", type, " '", spec.name, "'"));
      Tensor t = it->second;
      if (t.dtype() != DType::kF32)
        Fail(i, StrCat("its '", local, "' is not a floating-point tensor"));
      if (t.shape() != want.shape()) {
        if (t.numel() != want.shape().numel()) {
          Fail(i, StrCat("its '", local, "' is ", t.shape(), "; cnnflow ", type, " '", spec.name,
                         "' needs ", want.shape()));
        }
        t = t.Reshape(want.shape());
      }
      out_.tensors.emplace_back(TensorName(spec.name, local), t);
      given.erase(it);
    };
    for (const Parameter& p : layer->parameters()) take(p.name, p.value);
    for (const Buffer& b : layer->buffers()) take(b.name, b.value);
    CNNFLOW_ENFORCE(given.empty(), Where(i), ": tensor '", given.begin()->first, "' left over");
    vals_[output] = Val{spec.name, out};
    out_.layers.push_back(std::move(spec));
  }

  // One input, no tensors, the node's own scope as the name.
  void Simple(int i, const std::string& type, const Args& args = Args(),
              const std::string& x = "") {
    AddLayer(i, ScopeName(i), type, args, {x.empty() ? In(i, 0) : x}, {}, g_.node(i).output(0));
  }
  void Alias(int i, const std::string& from) {
    if (IsConst(from)) {
      consts_[g_.node(i).output(0)] = consts_.at(from);
    } else {
      vals_[g_.node(i).output(0)] = ValIn(i, 0);
    }
  }

  void Convert(int i) {
    const auto& n = g_.node(i);
    const std::string& op = n.op_type();
    if (n.output_size() < 1 || n.output(0).empty()) Fail(i, "has no output");
    if (!n.domain().empty() && n.domain() != "ai.onnx") {
      Fail(i, StrCat("is of the op domain '", n.domain(),
                     "'; the importer maps ONNX's own ops: ", OpList()));
    }
    if (auto f = fused_.find(i); f != fused_.end()) {
      if (!vals_.count(f->second.x))
        Fail(i, StrCat("reads '", f->second.x, "', which is not computed by a layer"));
      return Simple(i, f->second.type, f->second.args, f->second.x);
    }
    // Nodes on constants alone (shape arithmetic of some exporters) are
    // not layers; those the importer needs are Constant and Identity.
    NodeAttrs a(n, Where(i));
    if (op == "Constant") {
      Tensor t;
      if (const onnx::TensorProto* v = a.TensorAttr("value")) {
        t = ReadTensor(*v, Where(i));
      } else if (a.Has("value_float")) {
        t = Tensor::Full(Shape{1}, a.Float("value_float", 0));
      } else if (a.Has("value_int")) {
        t = Tensor::Full(Shape{1}, static_cast<double>(a.Int("value_int", 0)), DType::kI64);
      } else if (a.Has("value_ints")) {
        const std::vector<int64_t> v = a.Ints("value_ints", {});
        t = Tensor::Empty(Shape{static_cast<int64_t>(v.size())}, DType::kI64);
        std::copy(v.begin(), v.end(), t.data<int64_t>());
      } else if (a.Has("value_floats")) {
        const std::vector<float> v = a.Floats("value_floats");
        t = Tensor::Empty(Shape{static_cast<int64_t>(v.size())}, DType::kF32);
        std::copy(v.begin(), v.end(), t.data<float>());
      }
      a.Done();
      if (t.numel() == 0 && t.shape().rank() == 0) Fail(i, "has no value the importer reads");
      consts_[n.output(0)] = t;
      return;
    }
    if (op == "Identity") return a.Done(), Alias(i, In(i, 0));
    if (op == "Conv") return Conv(i, a);
    if (op == "ConvTranspose") return ConvTranspose(i, a);
    if (op == "BatchNormalization") return BatchNorm(i, a);
    if (op == "Gemm") return Gemm(i, a);
    if (op == "MatMul") return MatMul(i, a);
    if (op == "MaxPool" || op == "AveragePool") return Pool(i, a);
    if (op == "GlobalAveragePool") return a.Done(), GlobalPool(i, In(i, 0), true);
    if (op == "ReduceMean") return ReduceMean(i, a);
    if (op == "Flatten" || op == "Reshape") return Flatten(i, a);
    if (op == "Relu" || op == "Sigmoid" || op == "Tanh" || op == "HardSwish") {
      a.Done();
      std::string type = op == "HardSwish" ? "hardswish"
                         : op == "Relu"    ? "relu"
                         : op == "Tanh"    ? "tanh"
                                           : "sigmoid";
      return Simple(i, type);
    }
    if (op == "LeakyRelu") {
      Args args;
      args.Set("negative_slope", a.Float("alpha", 0.01));
      a.Done();
      return Simple(i, "leaky_relu", args);
    }
    if (op == "HardSigmoid") {
      const double alpha = a.Float("alpha", 0.2), beta = a.Float("beta", 0.5);
      a.Done();
      if (std::abs(alpha - 1.0 / 6) > 1e-6 || std::abs(beta - 0.5) > 1e-6) {
        Fail(i, StrCat("alpha ", alpha, ", beta ", beta,
                       ": cnnflow's hardsigmoid is PyTorch's (alpha 1/6, beta 0.5)"));
      }
      return Simple(i, "hardsigmoid");
    }
    if (op == "Gelu") {
      Args args;
      const std::string approx = a.String("approximate", "none");
      a.Done();
      if (approx != "none") args.Set("approximate", approx);
      return Simple(i, "gelu", args);
    }
    if (op == "Clip") return Clip(i, a);
    if (op == "Add" || op == "Mul" || op == "Div") return a.Done(), Arithmetic(i);
    if (op == "Concat") {
      const int64_t axis = a.Int("axis", 1);
      a.Done();
      if (n.input_size() == 0) Fail(i, "has no inputs");
      std::vector<std::string> ins;
      for (int k = 0; k < n.input_size(); ++k) {
        ValIn(i, k);  // each a computed value
        ins.push_back(In(i, k));
      }
      const int rank = vals_.at(ins[0]).shape.rank() + 1;
      if (axis != 1 && axis != 1 - rank)
        Fail(i, StrCat("concatenates along axis ", axis,
                       "; cnnflow's concat joins channels (axis 1)"));
      if (ins.size() == 1) return Alias(i, ins[0]);
      return AddLayer(i, ScopeName(i), "concat", Args(), ins, {}, n.output(0));
    }
    if (op == "Dropout") {
      double p = a.Float("ratio", 0.5);
      a.Int("seed", 0);
      a.Done();
      if (HasIn(i, 1)) {
        const auto r = ScalarIn(i, 1);
        if (!r) Fail(i, "its ratio is not a constant");
        p = Decimal(static_cast<float>(*r));
      }
      if (p <= 0) return Alias(i, In(i, 0));
      Args args;
      args.Set("p", p);
      return Simple(i, "dropout", args);
    }
    if (op == "Softmax" || op == "LogSoftmax") {
      a.Int("axis", -1);
      a.Done();
      if (n.output(0) != output_)
        Fail(i, "is not the model's last op; cnnflow has no softmax layer");
      out_.notes.push_back(
          StrCat(Where(i), ": the final ", op,
                 " is left out: cnnflow's loss and predict apply the softmax to the logits"));
      output_ = In(i, 0);
      return Alias(i, In(i, 0));
    }
    if (op == "Resize") return Resize(i, a);
    Fail(i, StrCat("no cnnflow layer for this op; the importer maps: ", OpList()));
  }

  static std::string OpList() {
    std::string s;
    for (const std::string& o : KnownOps()) s += (s.empty() ? "" : ", ") + o;
    return s;
  }

  // kernel, strides, pads, dilations of a Conv/ConvTranspose/pool node over
  // `s` spatial axes; pads must be the same at both ends of each axis.
  struct Window {
    std::vector<int64_t> kernel, stride, pad, dilation;
  };
  Window ReadWindow(int i, NodeAttrs& a, size_t s, const std::vector<int64_t>& kernel_from_weight,
                    const Shape& x) {
    Window w;
    w.kernel = a.Ints("kernel_shape", kernel_from_weight);
    if (w.kernel.size() != s || (!kernel_from_weight.empty() && w.kernel != kernel_from_weight)) {
      Fail(i, "kernel_shape does not fit its weight or input");
    }
    w.stride = a.Ints("strides", std::vector<int64_t>(s, 1));
    w.dilation = a.Ints("dilations", std::vector<int64_t>(s, 1));
    std::vector<int64_t> pads = a.Ints("pads", std::vector<int64_t>(2 * s, 0));
    const std::string auto_pad = a.String("auto_pad", "NOTSET");
    if (w.stride.size() != s || w.dilation.size() != s || pads.size() != 2 * s) {
      Fail(i, "strides, dilations or pads do not have one value per spatial axis");
    }
    constexpr int64_t kLargest = 1 << 20;  // beyond any network's, and no int64 overflow in shapes
    for (size_t d = 0; d < s; ++d) {
      if (w.stride[d] < 1 || w.dilation[d] < 1 || w.kernel[d] < 1)
        Fail(i, "a kernel, stride or dilation below 1");
      if (w.stride[d] > kLargest || w.dilation[d] > kLargest || w.kernel[d] > kLargest ||
          pads[d] > kLargest || pads[d] < -kLargest || pads[d + s] > kLargest ||
          pads[d + s] < -kLargest) {
        Fail(i, "a kernel, stride, dilation or pad beyond 2^20");
      }
    }
    if (auto_pad == "VALID") {
      std::fill(pads.begin(), pads.end(), 0);
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      for (size_t d = 0; d < s; ++d) {
        const int64_t in = x[static_cast<int>(d) + 1];
        const int64_t out = (in + w.stride[d] - 1) / w.stride[d];
        const int64_t total = std::max<int64_t>(
            0, (out - 1) * w.stride[d] + (w.kernel[d] - 1) * w.dilation[d] + 1 - in);
        pads[d] = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
        pads[d + s] = total - pads[d];
      }
    } else if (auto_pad != "NOTSET") {
      Fail(i, StrCat("auto_pad ", auto_pad, " is not an ONNX value"));
    }
    for (size_t d = 0; d < s; ++d) {
      if (pads[d] != pads[d + s] || pads[d] < 0) {
        Fail(i, StrCat("pads ", Shape(pads),
                       " differ at the two ends of an axis: cnnflow pads both "
                       "ends alike (export with symmetric padding, or pad in the data)"));
      }
      w.pad.push_back(pads[d]);
    }
    return w;
  }

  void Conv(int i, NodeAttrs& a) {
    const Val x = ValIn(i, 0);
    const Tensor& w = ConstIn(i, 1);
    const int s = w.shape().rank() - 2;
    if ((s != 1 && s != 2) || x.shape.rank() != s + 1) {
      Fail(i, StrCat("a weight ", w.shape(), " on samples ", x.shape,
                     ": cnnflow has conv1d and conv2d"));
    }
    std::vector<int64_t> k(w.shape().dims().begin() + 2, w.shape().dims().end());
    const Window win = ReadWindow(i, a, s, k, x.shape);
    const int64_t groups = a.Int("group", 1);
    a.Done();
    // Checked before the layer is built: its weight's size comes from the input.
    if (groups < 1 || groups > x.shape[0] || x.shape[0] != w.shape()[1] * groups) {
      Fail(i, StrCat("a weight ", w.shape(), " in ", groups, " groups does not fit ", x.shape[0],
                     " input channels"));
    }
    Args args;
    args.Set("out", w.shape()[0]);
    args.Set("kernel", k[0] == k.back() ? ParamValue(k[0]) : ParamValue(k));
    SetInts(args, "stride", win.stride, 1);
    SetInts(args, "pad", win.pad, 0);
    SetInts(args, "dilation", win.dilation, 1);
    if (groups != 1) args.Set("groups", groups);
    std::vector<std::pair<std::string, Tensor>> t = {{"weight", w}};
    if (HasIn(i, 2)) {
      t.emplace_back("bias", ConstIn(i, 2));
    } else {
      args.Set("bias", false);
    }
    AddLayer(i, WeightName(i, 1, "weight"), s == 2 ? "conv2d" : "conv1d", args, {In(i, 0)}, t,
             g_.node(i).output(0));
  }

  void ConvTranspose(int i, NodeAttrs& a) {
    const Val x = ValIn(i, 0);
    const Tensor& w = ConstIn(i, 1);
    if (w.shape().rank() != 4 || x.shape.rank() != 3) Fail(i, "cnnflow has conv_transpose2d only");
    std::vector<int64_t> k = {w.shape()[2], w.shape()[3]};
    const Window win = ReadWindow(i, a, 2, k, x.shape);
    const int64_t groups = a.Int("group", 1);
    if (groups < 1 || groups > x.shape[0] || x.shape[0] != w.shape()[0]) {
      Fail(i, StrCat("a weight ", w.shape(), " does not fit ", x.shape[0], " input channels"));
    }
    const std::vector<int64_t> output_pad = a.Ints("output_padding", {0, 0});
    if (a.Has("output_shape"))
      Fail(i, "output_shape is not supported (give pads and output_padding)");
    a.Done();
    if (output_pad.size() != 2 || std::any_of(output_pad.begin(), output_pad.end(),
                                              [](int64_t p) { return p < 0 || p > (1 << 20); })) {
      Fail(i, "output_padding needs two values of sensible size");
    }
    Args args;
    args.Set("out", w.shape()[1] * groups);
    args.Set("kernel", k[0] == k[1] ? ParamValue(k[0]) : ParamValue(k));
    SetInts(args, "stride", win.stride, 1);
    SetInts(args, "pad", win.pad, 0);
    SetInts(args, "output_pad", output_pad, 0);
    SetInts(args, "dilation", win.dilation, 1);
    if (groups != 1) args.Set("groups", groups);
    std::vector<std::pair<std::string, Tensor>> t = {{"weight", w}};
    if (HasIn(i, 2)) {
      t.emplace_back("bias", ConstIn(i, 2));
    } else {
      args.Set("bias", false);
    }
    AddLayer(i, WeightName(i, 1, "weight"), "conv_transpose2d", args, {In(i, 0)}, t,
             g_.node(i).output(0));
  }

  void BatchNorm(int i, NodeAttrs& a) {
    ValIn(i, 0);
    const double eps = a.Float("epsilon", 1e-5);
    const double momentum = a.Float("momentum", 0.9);
    a.Int("training_mode", 0);  // training or inference: cnnflow's layer does both
    if (a.Int("spatial", 1) != 1) Fail(i, "spatial = 0 (per-position statistics) is not supported");
    a.Int("is_test", 0);  // opset 6
    a.Done();
    if (momentum < 0 || momentum > 1) Fail(i, StrCat("momentum ", momentum, " is not in [0, 1]"));
    Args args;
    if (std::abs(eps - 1e-5) > 1e-12) args.Set("eps", eps);
    // ONNX's momentum weighs the running statistic, PyTorch's the batch's.
    const double m = Decimal(static_cast<float>(1 - momentum));
    if (std::abs(m - 0.1) > 1e-7) args.Set("momentum", m);
    AddLayer(i, WeightName(i, 1, "weight"), "batchnorm", args, {In(i, 0)},
             {{"weight", ConstIn(i, 1)},
              {"bias", ConstIn(i, 2)},
              {"running_mean", ConstIn(i, 3)},
              {"running_var", ConstIn(i, 4)}},
             g_.node(i).output(0));
  }

  // A [out, in] weight from a [in, out] one.
  static Tensor Transposed(const Tensor& w) {
    const int64_t r = w.shape()[0], c = w.shape()[1];
    Tensor t = Tensor::Empty(Shape{c, r}, DType::kF32);
    const float* src = w.data<float>();
    float* dst = t.data<float>();
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) dst[j * r + i] = src[i * c + j];
    return t;
  }

  void LiNear(int i, const std::string& base, const std::string& x, const Tensor& w,
              const Tensor* b, const std::string& output) {
    const Shape& in = vals_.at(x).shape;
    if (in.rank() != 1)
      Fail(i, StrCat("a matrix product of samples ", in, ": cnnflow's linear takes [N, features]"));
    if (w.shape().rank() != 2 || w.shape()[1] != in[0]) {
      Fail(i, StrCat("a weight ", w.shape(), " does not fit ", in[0], " input features"));
    }
    Args args;
    args.Set("out", w.shape()[0]);
    std::vector<std::pair<std::string, Tensor>> t = {{"weight", w}};
    if (b != nullptr) {
      t.emplace_back("bias", *b);
    } else {
      args.Set("bias", false);
    }
    AddLayer(i, base, "linear", args, {x}, t, output);
  }

  void Gemm(int i, NodeAttrs& a) {
    ValIn(i, 0);
    const Tensor& bm = ConstIn(i, 1);
    const double alpha = a.Float("alpha", 1), beta = a.Float("beta", 1);
    const int64_t trans_a = a.Int("transA", 0), trans_b = a.Int("transB", 0);
    a.Done();
    if (alpha != 1 || (beta != 1 && HasIn(i, 2)) || trans_a != 0 || bm.shape().rank() != 2) {
      Fail(i, "only y = x W^T + b (alpha 1, beta 1, transA 0, a 2-D weight) is a cnnflow linear");
    }
    const Tensor w = trans_b ? bm : Transposed(bm);
    const Tensor* b = HasIn(i, 2) ? &ConstIn(i, 2) : nullptr;
    LiNear(i, WeightName(i, 1, "weight"), In(i, 0), w, b, g_.node(i).output(0));
  }

  // x [N, in] @ W [in, out], with the bias of an Add that follows.
  void MatMul(int i, NodeAttrs& a) {
    a.Done();
    ValIn(i, 0);
    const Tensor& bm = ConstIn(i, 1);
    if (bm.shape().rank() != 2) Fail(i, "only x @ W with a 2-D constant W is a cnnflow linear");
    const Tensor w = Transposed(bm);
    std::string output = g_.node(i).output(0);
    const Tensor* b = nullptr;
    std::string base = ScopeName(i);
    const int add = SoleReader(output);
    if (IsBinary(add, "Add")) {
      const int k = g_.node(add).input(0) == output ? 1 : 0;
      const std::string& bias = g_.node(add).input(k);
      if (IsConst(bias) && consts_.at(bias).numel() == w.shape()[0]) {
        b = &consts_.at(bias);
        if (IsModulePath(bias) && EndsWith(bias, ".bias")) base = bias.substr(0, bias.size() - 5);
        skip_.insert(add);
        output = g_.node(add).output(0);
      }
    }
    LiNear(i, base, In(i, 0), w, b, output);
  }

  void Pool(int i, NodeAttrs& a) {
    const Val x = ValIn(i, 0);
    const bool max = g_.node(i).op_type() == "MaxPool";
    const int s = x.shape.rank() - 1;
    if (s != 1 && s != 2)
      Fail(i, StrCat("pools samples ", x.shape, ": cnnflow pools [C, L] and [C, H, W]"));
    const Window w = ReadWindow(i, a, s, {}, x.shape);
    const int64_t ceil_mode = a.Int("ceil_mode", 0);
    bool count_include_pad = false;
    if (max) {
      if (a.Int("storage_order", 0) != 0) Fail(i, "storage_order 1 is not supported");
      if (g_.node(i).output_size() > 1 && !g_.node(i).output(1).empty() &&
          readers_.count(g_.node(i).output(1))) {
        Fail(i, "its indices output is used; cnnflow's max pooling has none");
      }
    } else {
      count_include_pad = a.Int("count_include_pad", 0) != 0;
    }
    a.Done();
    for (int d = 0; d < s; ++d) {
      if (w.dilation[d] != 1) Fail(i, "dilated pooling is not supported");
      // ceil_mode rounds the output size up; only where that changes nothing
      // is it cnnflow's (floor) pooling.
      if (ceil_mode && (x.shape[d + 1] + 2 * w.pad[d] - w.kernel[d]) % w.stride[d] != 0) {
        Fail(i, "ceil_mode = 1 gives a larger output than cnnflow's pooling (floor) here");
      }
    }
    Args args;
    args.Set("kernel",
             w.kernel[0] == w.kernel.back() ? ParamValue(w.kernel[0]) : ParamValue(w.kernel));
    args.Set("stride",
             w.stride[0] == w.stride.back() ? ParamValue(w.stride[0]) : ParamValue(w.stride));
    SetInts(args, "pad", w.pad, 0);
    if (!max && !count_include_pad &&
        std::any_of(w.pad.begin(), w.pad.end(), [](int64_t p) { return p > 0; })) {
      args.Set("count_include_pad", false);
    }
    Simple(i, StrCat(max ? "maxpool" : "avgpool", s, "d"), args);
  }

  // The mean over the positions: global_avgpool [C] when a flatten is the
  // only reader (or keep_dims is false), else adaptive_avgpool {out: 1}.
  void GlobalPool(int i, const std::string& x, bool keep_dims) {
    const Val v = ValIn(i, 0);
    if (v.shape.rank() < 2) Fail(i, "pools a flat sample");
    std::string output = g_.node(i).output(0);
    const int f = SoleReader(output);
    if (keep_dims && IsFlatten(f, Shape{v.shape[0]})) {
      skip_.insert(f);
      output = g_.node(f).output(0);
      keep_dims = false;
    }
    if (!keep_dims) return AddLayer(i, ScopeName(i), "global_avgpool", Args(), {x}, {}, output);
    Args args;
    args.Set("out", int64_t{1});
    AddLayer(i, ScopeName(i), v.shape.rank() == 3 ? "adaptive_avgpool2d" : "adaptive_avgpool1d",
             args, {x}, {}, output);
  }

  // Whether node f flattens samples of `sample` shape, [N, ...] to [N, -1]
  // (Flatten axis 1, or a Reshape to a constant [0 | -1 | N, -1 | C*H*W];
  // N: the batch of an input exported at a fixed batch size).
  bool IsFlatten(int f, const Shape& sample) const {
    if (f < 0 || g_.node(f).output_size() < 1) return false;
    if (IsOp(f, "Flatten")) {
      for (const auto& at : g_.node(f).attribute())
        if (at.name() == "axis" && at.i() != 1) return false;
      return true;
    }
    if (IsOp(f, "Reshape") && HasIn(f, 1) && IsConst(In(f, 1))) {
      const std::vector<int64_t> s = IntsOf(consts_.at(In(f, 1)));
      return s.size() == 2 && (s[1] == -1 || s[1] == sample.numel()) &&
             !(s[0] == -1 && s[1] == -1) &&
             (s[0] == 0 || s[0] == -1 || (batch_ > 0 && s[0] == batch_));
    }
    return false;
  }

  void ReduceMean(int i, NodeAttrs& a) {
    const Val x = ValIn(i, 0);
    std::vector<int64_t> axes = a.Ints("axes", {});
    const int64_t keep = a.Int("keepdims", 1);
    a.Int("noop_with_empty_axes", 0);  // opset 18: the axes are given below
    a.Done();
    if (HasIn(i, 1)) axes = IntsOf(ConstIn(i, 1));  // opset 18
    const int rank = x.shape.rank() + 1;
    for (int64_t& ax : axes) ax = ax < 0 ? ax + rank : ax;
    std::sort(axes.begin(), axes.end());
    std::vector<int64_t> spatial;
    for (int d = 2; d < rank; ++d) spatial.push_back(d);
    if (axes != spatial)
      Fail(i, "a mean over other axes than all the spatial ones has no cnnflow layer");
    GlobalPool(i, In(i, 0), keep != 0);
  }

  void Flatten(int i, NodeAttrs& a) {
    const Val x = ValIn(i, 0);
    if (g_.node(i).op_type() == "Flatten") {
      const int64_t axis = a.Int("axis", 1);
      a.Done();
      if (axis != 1)
        Fail(i,
             StrCat("flattens from axis ", axis, "; cnnflow's flatten keeps the batch (axis 1)"));
    } else {
      a.Int("allowzero", 0);
      a.Done();
      if (!IsFlatten(i, x.shape)) {
        Fail(i,
             HasIn(i, 1) && !IsConst(In(i, 1))
                 ? "its target shape is computed (x.view(x.size(0), -1) exports so); "
                   "torch.flatten(x, 1) exports as a Flatten"
                 : "reshapes to another shape than [N, -1]; only that flatten is a cnnflow layer");
      }
    }
    if (x.shape.rank() == 1) return Alias(i, In(i, 0));
    Simple(i, "flatten");
  }

  void Clip(int i, NodeAttrs& a) {
    double lo = a.Float("min", -INFINITY), hi = a.Float("max", INFINITY);  // opset < 11
    a.Done();
    if (HasIn(i, 1)) {
      const auto v = ScalarIn(i, 1);
      if (!v) Fail(i, "its min is not a scalar constant");
      lo = *v;
    }
    if (HasIn(i, 2)) {
      const auto v = ScalarIn(i, 2);
      if (!v) Fail(i, "its max is not a scalar constant");
      hi = *v;
    }
    if (lo == 0 && hi == 6) return Simple(i, "relu6");
    if (lo == 0 && std::isinf(hi) && hi > 0) return Simple(i, "relu");
    Fail(i, StrCat("clips to [", lo, ", ", hi, "]; cnnflow has relu6 [0, 6] and relu [0, inf)"));
  }

  // Add, Mul, Div of computed values and constants.
  void Arithmetic(int i) {
    const auto& n = g_.node(i);
    const std::string& op = n.op_type();
    if (n.input_size() != 2) Fail(i, "needs two inputs");
    const bool c0 = IsConst(In(i, 0)), c1 = IsConst(In(i, 1));
    if (c0 && c1) Fail(i, "computes on constants alone (fold them: do_constant_folding=True does)");
    if (!c0 && !c1) {
      if (op == "Div") Fail(i, "divides one computed value by another; cnnflow has no such layer");
      std::vector<std::string> ins = {In(i, 0), In(i, 1)};
      // mul's second input is the one broadcast ([C, 1, 1] gates).
      if (op == "Mul" && ValIn(i, 0).shape.numel() < ValIn(i, 1).shape.numel())
        std::swap(ins[0], ins[1]);
      return AddLayer(i, ScopeName(i), op == "Add" ? "add" : "mul", Args(), ins, {}, n.output(0));
    }
    const int xk = c0 ? 1 : 0;
    const Val x = ValIn(i, xk);
    const std::string& cname = In(i, 1 - xk);
    const Tensor& c = consts_.at(cname);
    if (c.dtype() != DType::kF32) Fail(i, "its constant is not a floating-point tensor");
    if (op == "Add") {
      Fail(i,
           "adds a constant tensor to a computed value; cnnflow has no such layer (a bias "
           "belongs to the layer before)");
    }
    if (op == "Div" && xk != 0)
      Fail(i, "divides a constant by a computed value; cnnflow has no such layer");
    if (c.numel() == 1) {
      const double s = op == "Div" ? 1.0 / c.At(0) : c.At(0);
      Args args;
      args.Set("scale", std::vector<double>{Decimal(static_cast<float>(s))});
      return Simple(i, "mul", args, In(i, xk));
    }
    // A per-channel scale: [C, 1, 1] (with a leading 1 or not) is ConvNeXt's layer scale.
    const int64_t channels = x.shape[0];
    if (op == "Mul" && c.numel() == channels && x.shape.rank() >= 2) {
      const std::string base = IsModulePath(cname) ? cname : ScopeName(i);
      return AddLayer(i, base, "layer_scale", Args(), {In(i, xk)}, {{"", c}}, n.output(0));
    }
    Fail(i, StrCat(op == "Mul" ? "multiplies" : "divides", " by a constant ", c.shape(),
                   "; cnnflow takes a scalar, or a per-channel [C, 1, 1] scale (layer_scale)"));
  }

  void Resize(int i, NodeAttrs& a) {
    const Val x = ValIn(i, 0);
    const std::string mode = a.String("mode", "nearest");
    const std::string coord = a.String("coordinate_transformation_mode", "half_pixel");
    const std::string nearest = a.String("nearest_mode", "round_prefer_floor");
    a.Float("cubic_coeff_a", -0.75);
    if (a.Int("exclude_outside", 0) != 0) Fail(i, "exclude_outside is not supported");
    a.Float("extrapolation_value", 0);
    a.Done();
    if (x.shape.rank() != 3) Fail(i, "cnnflow's upsample takes [C, H, W] samples");
    Args args;
    if (mode == "nearest") {
      if (coord != "asymmetric" || nearest != "floor") {
        Fail(i, StrCat("nearest with ", coord, " / ", nearest,
                       "; cnnflow's is PyTorch's (asymmetric, floor)"));
      }
    } else if (mode == "linear") {
      args.Set("mode", std::string("bilinear"));
      if (coord == "align_corners") {
        args.Set("align_corners", true);
      } else if (coord != "half_pixel" && coord != "pytorch_half_pixel") {
        Fail(i, StrCat("linear with ", coord, "; cnnflow takes half_pixel or align_corners"));
      }
    } else {
      Fail(i, StrCat("mode ", mode, "; cnnflow's upsample is nearest or (bi)linear"));
    }
    const Tensor* scales = HasIn(i, 2) ? &ConstIn(i, 2) : nullptr;
    const Tensor* sizes = HasIn(i, 3) ? &ConstIn(i, 3) : nullptr;
    if (scales != nullptr && scales->numel() == 4) {
      if (scales->At(0) != 1 || scales->At(1) != 1) Fail(i, "scales the batch or the channels");
      const double sh = scales->At(2), sw = scales->At(3);
      if (!(sh > 0 && sh <= 1024 && sw > 0 && sw <= 1024))
        Fail(i, StrCat("scales ", sh, " x ", sw, " are not in (0, 1024]"));
      args.Set("scale", sh == sw ? std::vector<double>{sh} : std::vector<double>{sh, sw});
    } else if (sizes != nullptr && sizes->numel() == 4) {
      const double h = sizes->At(2), w = sizes->At(3);
      if (!(h >= 1 && h <= (1 << 20) && w >= 1 && w <= (1 << 20)))
        Fail(i, "sizes are not in [1, 2^20]");
      args.Set("size", std::vector<int64_t>{static_cast<int64_t>(h), static_cast<int64_t>(w)});
    } else {
      Fail(i, "needs constant scales or sizes of 4 values");
    }
    Simple(i, "upsample", args);
  }

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

std::vector<double> ParseFloats(const std::string& s, const char* flag) {
  std::vector<double> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    const double d = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0')
      throw UsageError(StrCat(flag, " takes numbers separated by commas, not '", s, "'"));
    v.push_back(d);
  }
  return v;
}

std::string Floats(const std::vector<double>& v) {
  std::string s;
  for (double d : v) s += StrCat(s.empty() ? "" : ", ", ParamValueToString(ParamValue(d)));
  return "[" + s + "]";
}

}  // namespace

ImportedOnnx ImportOnnx(const void* bytes, size_t size, const std::string& what) {
  if (size > static_cast<size_t>(INT_MAX)) {
    throw Error(StrCat(what, ": ", size,
                       " bytes; protobuf reads ONNX files up to 2 GiB (larger "
                       "models keep their weights in external files, which the "
                       "importer does not read)"));
  }
  onnx::ModelProto proto;
  if (!proto.ParseFromArray(bytes, static_cast<int>(size))) {
    throw Error(StrCat(what,
                       ": not an ONNX model (its protobuf does not parse: a truncated file, or "
                       "another kind of file)"));
  }
  if (!proto.has_graph() || proto.graph().node_size() == 0) {
    throw Error(StrCat(what, ": not an ONNX model, or one without a graph (no nodes)"));
  }
  ImportedOnnx m = OnnxImporter(proto, what).Run();
  if (m.name.empty() || !IsModulePath(m.name)) m.name = "imported";
  return m;
}

std::string ImportedConfig(const ImportedOnnx& m, const std::string& onnx_path,
                           const std::vector<double>& mean, const std::vector<double>& std) {
  const std::string shape = m.input_shape.ToString();
  std::ostringstream y;
  y << "# Imported by `cnnflow import` from " << fs::path(onnx_path).filename().string() << " ("
    << m.source << "): " << m.onnx_nodes << " ONNX nodes, " << m.layers.size() << " layers.\n"
    << "# The weights are model.safetensors beside this file (train.init reads them):\n"
    << "#   cnnflow predict model.yaml --weights model.safetensors IMAGE.jpg\n"
    << "# (predict decodes as data.test does: a centre crop of the input's size; an\n"
    << "# ImageNet network wants its images resized first: resize_min_side: 256 in a\n"
    << "# folder or lmdb source)\n"
    << "# Before training, replace:\n"
    << "#   - data: a synthetic placeholder of the input's shape; your data set's source\n"
    << "#     (cnnflow stages lists them) and its augmentation;\n"
    << (mean.empty() ? "#   - add the normalisation the network was trained with:\n"
                       "#     transform: [{normalize: {mean: [...], std: [...]}}] under data;\n"
                     : "")
    << "#   - train: epochs, batch, optimizer and schedule; graph: devices.\n";
  for (const std::string& note : m.notes) y << "# Note: " << note << "\n";
  y << "name: " << m.name << "\n"
    << "seed: 0\n"
    << "data:\n"
    << "  train: {source: synthetic, shape: " << shape << ", classes: " << m.classes
    << ", size: 1024}\n"
    << "  test: {source: synthetic, shape: " << shape << ", classes: " << m.classes
    << ", size: 256, seed: 1}\n";
  if (!mean.empty())
    y << "  transform: [{normalize: {mean: " << Floats(mean) << ", std: " << Floats(std) << "}}]\n";
  y << "model:\n"
    << "  input: " << shape << "\n"
    << "  layers:\n";
  for (const LayerSpec& s : m.layers) y << "    " << LayerSpecLine(s) << "\n";
  y << "train:\n"
    << "  epochs: 1\n"
    << "  batch: 32\n"
    << "  optimizer: {sgd: {lr: 0.01, momentum: 0.9, weight_decay: 0.0001}}\n"
    << "  init: {weights: model.safetensors}\n";
  return y.str();
}

namespace {

// DIR written whole or not at all: into a temporary folder beside it,
// checked by loading it as `cnnflow train` would (the config parsed, the
// model built, the weights read strictly), then renamed to DIR.
void WriteImported(const ImportedOnnx& m, const std::string& config, const std::string& dir) {
  const fs::path out = fs::absolute(dir).lexically_normal();
  if (fs::exists(out) && !(fs::is_directory(out) && fs::is_empty(out))) {
    throw Error(
        StrCat(dir, ": exists and is not an empty folder; cnnflow import writes a new one"));
  }
  fs::create_directories(out.parent_path());
  const fs::path tmp =
      out.parent_path() / StrCat(".", out.filename().string(), ".tmp.", ::getpid());
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  try {
    WriteFileAtomically((tmp / "model.yaml").string(), config);
    SaveSafetensors((tmp / "model.safetensors").string(), m.tensors,
                    {{"format", "pt"}, {"cnnflow", "import"}});
    const RunConfig rc = LoadRunConfig((tmp / "model.yaml").string());
    auto model = Model::Build(rc.layers, rc.input_shape);
    LoadStateDict(LoadSafetensors((tmp / "model.safetensors").string()).tensors, {model.get()}, {},
                  (tmp / "model.safetensors").string());
    if (fs::exists(out)) fs::remove(out);  // empty
    fs::rename(tmp, out);
    FsyncDir(out.parent_path().string());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace

int RunImport(const std::vector<std::string>& args) {
  std::string in, out, name;
  std::vector<double> mean, std;
  try {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      if (a == "-h" || a == "--help") return std::printf("%s", kImportUsage), 0;
      if (a == "-o" && i + 1 < args.size()) {
        out = args[++i];
      } else if (a == "--name" && i + 1 < args.size()) {
        name = args[++i];
      } else if (a == "--mean" && i + 1 < args.size()) {
        mean = ParseFloats(args[++i], "--mean");
      } else if (a == "--std" && i + 1 < args.size()) {
        std = ParseFloats(args[++i], "--std");
      } else if (in.empty() && !a.empty() && a[0] != '-') {
        in = a;
      } else {
        throw UsageError(StrCat("unexpected argument '", a, "'"));
      }
    }
    if (in.empty() || out.empty()) throw UsageError("needs MODEL.onnx and -o DIR");
    if (mean.size() != std.size()) throw UsageError("--mean and --std need as many values each");
    if (!name.empty() && !IsModulePath(name))
      throw UsageError(StrCat("--name '", name, "': letters, digits, _ and ."));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "cnnflow import: %s\n\n%s", e.what(), kImportUsage);
    return 2;
  }
  try {
    std::ifstream f(in, std::ios::binary);
    if (!f) throw Error(StrCat(in, ": cannot open: ", ErrnoText(errno)));
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ImportedOnnx m = ImportOnnx(bytes.data(), bytes.size(), in);
    if (!name.empty()) {
      m.name = name;
    } else if (m.name == "imported" || m.name == "main_graph" || m.name == "torch_jit" ||
               m.name == "main") {
      const std::string stem = fs::path(in).stem().string();
      if (IsModulePath(stem)) m.name = stem;
    }
    if (!mean.empty() && mean.size() != static_cast<size_t>(m.input_shape[0])) {
      throw Error(
          StrCat("--mean has ", mean.size(), " values for ", m.input_shape[0], " input channels"));
    }
    WriteImported(m, ImportedConfig(m, in, mean, std), out);
    int64_t params = 0;
    for (const auto& [n, t] : m.tensors) params += t.numel();
    std::printf(
        "imported %s (%s): %d ONNX nodes -> %zu layers, %zu tensors (%.2f M values), input %s, "
        "%lld classes\n",
        in.c_str(), m.source.c_str(), m.onnx_nodes, m.layers.size(), m.tensors.size(), params / 1e6,
        m.input_shape.ToString().c_str(), static_cast<long long>(m.classes));
    for (const std::string& note : m.notes) std::printf("note: %s\n", note.c_str());
    std::printf("wrote %s/model.yaml and %s/model.safetensors\n", out.c_str(), out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cnnflow import: %s\n", e.what());
    return 1;
  }
}

}  // namespace cnnflow
