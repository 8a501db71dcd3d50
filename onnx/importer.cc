#include "onnx/importer.h"

#include <google/protobuf/unknown_field_set.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "onnx/converter.h"
#include "onnx/tensor_proto.h"
#include "ops/error.h"
#include "ops/layer.h"

namespace cnnflow::onnx_io {
namespace {

// The module path of a node's scope: torch.onnx names a node
// "/layer1/layer1.0/conv1/Conv", each part a module's name as its parent
// knows it, prefixed by the parent's when it is a list item
// ("features.1", then "features.1.0"); "" when the name is not of that form.
std::string ScopePath(const std::string& node_name) {
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
std::string MetadataScope(const onnx::NodeProto& n) {
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
}  // namespace

// [A-Za-z0-9_-] words joined by single dots: a PyTorch module path (a
// ModuleDict's or Sequential's keys may hold '-': RegNet's "block1-0").
bool IsModulePath(const std::string& s) {
  if (s.empty() || s.front() == '.' || s.back() == '.' || s.front() == '-') return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '.' && s[i + 1] == '.') return false;
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-')) {
      return false;
    }
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

Tensor Transposed(const Tensor& w) {
  const int64_t r = w.shape()[0], c = w.shape()[1];
  Tensor t = Tensor::Empty(Shape{c, r}, DType::kF32);
  const float* src = w.data<float>();
  float* dst = t.data<float>();
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) dst[j * r + i] = src[i * c + j];
  return t;
}

std::vector<std::pair<std::string, Tensor>> WeightAndBias(const Tensor& w, const Tensor* b,
                                                          Args& args) {
  std::vector<std::pair<std::string, Tensor>> t = {{"weight", w}};
  if (b != nullptr) {
    t.emplace_back("bias", *b);
  } else {
    args.Set("bias", false);
  }
  return t;
}

// The layer types whose output means the same over a channels-last view of
// their input (elementwise ops), and the two that the converters map from
// channels-last ops (LayerNormalization and MatMul over the last axis).
bool WorksChannelsLast(const std::string& type) {
  static const std::set<std::string> types = {
      "add",        "mul",         "dropout",   "drop_path",     "relu",      "relu6",
      "gelu",       "silu",        "sigmoid",   "tanh",          "hardswish", "hardsigmoid",
      "leaky_relu", "layer_scale", "layernorm", "channel_linear"};
  return types.count(type) != 0;
}

OnnxImporter::OnnxImporter(const onnx::ModelProto& m, std::string what)
    : m_(m), g_(m.graph()), what_(std::move(what)) {
  for (const auto& op : m.opset_import())
    if (op.domain().empty() || op.domain() == "ai.onnx") opset_ = static_cast<int>(op.version());
}

ImportedOnnx OnnxImporter::Run() {
  out_.onnx_nodes = g_.node_size();
  out_.source =
      StrCat(m_.producer_name().empty() ? "unknown producer" : m_.producer_name(),
             m_.producer_version().empty() ? "" : " " + m_.producer_version(), ", opset ", opset_);
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
  // In order: a node whose inputs became constants on the way (shape
  // arithmetic after a Shape) is folded, else converted.
  for (int i = 0; i < g_.node_size(); ++i) {
    if (live_[i] && !skip_.count(i) && !FoldConstant(i)) Convert(i);
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

// ---- the graph's input, what the output needs, the constants

void OnnxImporter::ReadInput() {
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
  if (!type.has_tensor_type() ||
      type.tensor_type().elem_type() != onnx::TensorProto_DataType_FLOAT) {
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
void OnnxImporter::MarkLive() {
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

// ---- the context converters read

std::string OnnxImporter::Where(int i) const {
  const auto& n = g_.node(i);
  return StrCat(what_, ": node ", n.name().empty() ? StrCat("#", i) : StrCat("'", n.name(), "'"),
                " (", n.op_type(), ")");
}

void OnnxImporter::Fail(int i, const std::string& msg) const {
  throw Error(StrCat(Where(i), ": ", msg));
}

const std::string& OnnxImporter::In(int i, int k) const {
  const auto& n = g_.node(i);
  if (k >= n.input_size() || n.input(k).empty()) Fail(i, StrCat("has no input ", k));
  return n.input(k);
}

bool OnnxImporter::HasIn(int i, int k) const {
  return k < g_.node(i).input_size() && !g_.node(i).input(k).empty();
}

const Tensor& OnnxImporter::ConstIn(int i, int k) const {
  auto it = consts_.find(In(i, k));
  if (it == consts_.end())
    Fail(i, StrCat("input ", k, " ('", In(i, k), "') must be a constant (an initializer)"));
  return it->second;
}

const Val& OnnxImporter::ValIn(int i, int k) const {
  auto it = vals_.find(In(i, k));
  if (it == vals_.end()) {
    Fail(i,
         StrCat("input ", k, " ('", In(i, k), "') ",
                IsConst(In(i, k)) ? "is a constant; this op needs a computed value there"
                                  : "is not computed from the model's input by the layers before"));
  }
  return it->second;
}

// A scalar constant input, or nullopt.
std::optional<double> OnnxImporter::ScalarIn(int i, int k) const {
  if (!HasIn(i, k) || !IsConst(In(i, k))) return std::nullopt;
  const Tensor& t = consts_.at(In(i, k));
  if (t.numel() != 1) return std::nullopt;
  return t.At(0);
}

// The one live node that reads `v`, or -1 (none, several, or the graph's output).
int OnnxImporter::SoleReader(const std::string& v) const {
  if (v == output_) return -1;
  auto it = readers_.find(v);
  return it != readers_.end() && it->second.size() == 1 ? it->second[0] : -1;
}

// An elementwise op of two inputs and an output (what the patterns read).
bool OnnxImporter::IsBinary(int i, const char* op) const {
  return IsOp(i, op) && g_.node(i).input_size() == 2 && g_.node(i).output_size() >= 1;
}

int OnnxImporter::Producer(const std::string& v) const {
  auto it = producer_.find(v);
  return it == producer_.end() ? -1 : it->second;
}

// Whether node f flattens samples of `sample` shape, [N, ...] to [N, -1]
// (Flatten axis 1, or a Reshape to a constant [0 | -1 | N, -1 | C*H*W];
// N: the batch of an input exported at a fixed batch size).
bool OnnxImporter::IsFlatten(int f, const Shape& sample) const {
  if (f < 0 || g_.node(f).output_size() < 1) return false;
  if (IsOp(f, "Flatten")) {
    for (const auto& at : g_.node(f).attribute())
      if (at.name() == "axis" && at.i() != 1) return false;
    return true;
  }
  if (IsOp(f, "Reshape") && HasIn(f, 1) && IsConst(In(f, 1))) {
    const std::vector<int64_t> s = IntsOf(consts_.at(In(f, 1)));
    return s.size() == 2 && (s[1] == -1 || s[1] == sample.numel()) && !(s[0] == -1 && s[1] == -1) &&
           IsBatchDim(s[0]);
  }
  return false;
}

Window OnnxImporter::ReadWindow(int i, NodeAttrs& a, size_t s,
                                const std::vector<int64_t>& kernel_from_weight,
                                const Shape& x) const {
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

// ---- names

// The name of a parameter-free layer (or one whose weights are not
// PyTorch's): its scope's module path, else the op in lower case.
std::string OnnxImporter::ScopeName(int i) const {
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
std::string OnnxImporter::WeightName(int i, int k, const std::string& local) const {
  const std::string& v = In(i, k);
  if (IsModulePath(v) && EndsWith(v, "." + local)) return v.substr(0, v.size() - local.size() - 1);
  return ScopeName(i);
}

std::string OnnxImporter::UniqueName(int i, const std::string& base, bool has_params) {
  std::string name = base;
  for (int k = 1; used_.count(name) || (!has_params && reserved_.count(name)); ++k)
    name = StrCat(base, "_", k);
  if (has_params && with_weights_.count(base)) {
    out_.notes.push_back(StrCat(Where(i), ": uses the weights of layer '", base, "' again; layer '",
                                name, "' gets a copy of its own (they train apart)"));
  }
  used_.insert(name);
  if (has_params) with_weights_.insert(name);
  return name;
}

// ---- layers

// Adds a layer of `type` reading `inputs` (values), with its tensors by
// local name, and builds it: the shapes and every tensor are checked
// here, so an error names the ONNX node.
void OnnxImporter::AddLayer(int i, const std::string& base, const std::string& type,
                            const Args& args, const std::vector<std::string>& inputs,
                            std::vector<std::pair<std::string, Tensor>> tensors,
                            const std::string& output) {
  const LayerType* lt = LayerRegistry::Get().Find(type);
  CNNFLOW_ENFORCE(lt != nullptr, "no layer type ", type);
  LayerSpec spec;
  spec.name = UniqueName(i, base, !tensors.empty());
  spec.type = type;
  spec.args = args;
  std::vector<Shape> shapes;
  bool channels_last = false;
  for (size_t k = 0; k < inputs.size(); ++k) {
    auto it = vals_.find(inputs[k]);
    if (it == vals_.end())
      Fail(i, StrCat("reads '", inputs[k], "', which no layer before computes"));
    const Val& val = it->second;
    spec.inputs.push_back(val.layer);
    shapes.push_back(val.shape);
    if (k > 0 && val.channels_last != channels_last)
      Fail(i, "joins a channels-last value (after a Transpose) with a channels-first one");
    channels_last = val.channels_last;
  }
  if (channels_last && !WorksChannelsLast(type)) {
    Fail(i,
         StrCat("reads a channels-last value (a Transpose to [N, H, W, C] before it); cnnflow's ",
                type, " reads channels-first: transpose back first"));
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
  vals_[output] = Val{spec.name, out, channels_last};
  out_.layers.push_back(std::move(spec));
}

// One input, no tensors, the node's own scope as the name.
void OnnxImporter::Simple(int i, const std::string& type, const Args& args, const std::string& x) {
  AddLayer(i, ScopeName(i), type, args, {x.empty() ? In(i, 0) : x}, {}, g_.node(i).output(0));
}

void OnnxImporter::AliasLayout(int i, const std::string& from, bool channels_last) {
  Val v = vals_.at(from);
  v.channels_last = channels_last;
  vals_[g_.node(i).output(0)] = v;
}

void OnnxImporter::Alias(int i, const std::string& from) {
  if (IsConst(from)) {
    consts_[g_.node(i).output(0)] = consts_.at(from);
  } else {
    vals_[g_.node(i).output(0)] = ValIn(i, 0);
  }
}

void OnnxImporter::Convert(int i) {
  const auto& n = g_.node(i);
  if (n.output_size() < 1 || n.output(0).empty()) Fail(i, "has no output");
  if (!n.domain().empty() && n.domain() != "ai.onnx") {
    Fail(i, StrCat("is of the op domain '", n.domain(),
                   "'; the importer maps ONNX's own ops: ", ImportableOps()));
  }
  if (auto f = fused_.find(i); f != fused_.end()) {
    if (!vals_.count(f->second.x))
      Fail(i, StrCat("reads '", f->second.x, "', which is not computed by a layer"));
    if (f->second.resolve) f->second.resolve(i, f->second);
    const Shape& want = f->second.x_shape;
    if (want.rank() > 0 && vals_.at(f->second.x).shape != want) {
      Fail(i, StrCat("ends a ", f->second.type, " pattern over samples ", want, ", but its input '",
                     f->second.x, "' is ", vals_.at(f->second.x).shape));
    }
    return Simple(i, f->second.type, f->second.args, f->second.x);
  }
  NodeAttrs a(n, Where(i));
  const OnnxImport* c = OnnxImportRegistry::Get().Find(n.op_type());
  if (c == nullptr)
    Fail(i, StrCat("no cnnflow layer for this op; the importer maps: ", ImportableOps()));
  c->convert(*this, i, a);
}

}  // namespace cnnflow::onnx_io
