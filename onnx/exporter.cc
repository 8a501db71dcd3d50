#include "onnx/exporter.h"

#include "onnx/converter.h"
#include "onnx/export.h"
#include "ops/error.h"

namespace cnnflow::onnx_io {
namespace {

void AddValueInfo(onnx::ValueInfoProto* v, const std::string& name, const Shape& sample) {
  v->set_name(name);
  onnx::TypeProto_Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto_DataType_FLOAT);
  onnx::TensorShapeProto* s = t->mutable_shape();
  s->add_dim()->set_dim_param("N");
  for (int64_t d : sample.dims()) s->add_dim()->set_dim_value(d);
}

}  // namespace

OnnxExporter::OnnxExporter(const Model& model, const std::string& name) : model_(model) {
  proto_.set_ir_version(8);  // the IR of opset 17 (ONNX 1.12)
  proto_.set_producer_name("cnnflow");
  proto_.set_model_version(1);
  onnx::OperatorSetIdProto* op = proto_.add_opset_import();
  op->set_domain("");
  op->set_version(kOnnxOpset);
  graph_ = proto_.mutable_graph();
  graph_->set_name(name);
}

onnx::ModelProto OnnxExporter::Build() {
  AddValueInfo(graph_->add_input(), "input", model_.input_shape());
  for (int i = 0; i < model_.num_layers(); ++i) AddLayer(i);
  AddValueInfo(graph_->add_output(), "logits", model_.output_shape());
  return proto_;
}

std::string OnnxExporter::Out(int i) const {
  if (i == model_.num_layers() - 1) return "logits";
  const Layer& l = model_.layer(i);
  for (const Parameter& p : l.parameters())
    if (p.name.empty()) return l.name() + "/output";  // the layer's name is its tensor's
  return l.name();
}

int OnnxExporter::Source(int i, int k) const {
  const std::string& n = model_.inputs_of(i)[k];
  for (int j = 0; j < i; ++j)
    if (model_.layer(j).name() == n) return j;
  return -1;
}

std::string OnnxExporter::In(int i, int k) const {
  const int j = Source(i, k);
  return j < 0 ? std::string("input") : Out(j);
}

Shape OnnxExporter::InShape(int i, int k) const {
  const int j = Source(i, k);
  return j < 0 ? model_.input_shape() : model_.output_shape(j);
}

void OnnxExporter::AddInitializer(const std::string& name, const Tensor& value) {
  const Tensor host = value.To(Device::Cpu());
  const Tensor f = host.dtype() == DType::kF32 ? host : host.Cast(DType::kF32);
  onnx::TensorProto* t = graph_->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto_DataType_FLOAT);
  for (int64_t d : f.shape().dims()) t->add_dims(d);
  t->set_raw_data(f.raw_data(), f.nbytes());  // little-endian, as ONNX stores raw data
}

void OnnxExporter::AddFilled(const std::string& name, int64_t n, float v) {
  Tensor t = Tensor::Full(Shape{n}, v, DType::kF32);
  AddInitializer(name, t);
}

void OnnxExporter::AddInts(const std::string& name, const std::vector<int64_t>& v) {
  onnx::TensorProto* t = graph_->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto_DataType_INT64);
  t->add_dims(static_cast<int64_t>(v.size()));
  for (int64_t x : v) t->add_int64_data(x);
}

std::string OnnxExporter::Unsqueezed(int i, const std::string& value, int rank, int extra,
                                     const std::string& suffix) {
  if (extra <= 0) return value;
  std::vector<int64_t> axes;
  for (int a = rank; a < rank + extra; ++a) axes.push_back(a);
  const std::string out = model_.layer(i).name() + "/" + suffix;
  AddInts(out + "_axes", axes);
  Node("Unsqueeze", i, {value, out + "_axes"}, out, "/" + suffix);
  return out;
}

std::pair<std::string, std::string> OnnxExporter::AffineOrIdentity(const Layer& l, bool affine,
                                                                   int64_t channels) {
  if (affine) return {Weight(l, "weight"), Weight(l, "bias")};
  const std::string w = TensorName(l.name(), "weight"), b = TensorName(l.name(), "bias");
  AddFilled(w, channels, 1);
  AddFilled(b, channels, 0);
  return {w, b};
}

std::string OnnxExporter::Weight(const Layer& l, const std::string& local) {
  const std::string name = TensorName(l.name(), local);
  for (const Parameter& p : l.parameters())
    if (p.name == local) return AddInitializer(name, p.value), name;
  for (const Buffer& b : l.buffers())
    if (b.name == local) return AddInitializer(name, b.value), name;
  throw Error(StrCat("layer '", l.name(), "' has no tensor '", local, "'"));
}

onnx::NodeProto* OnnxExporter::Node(const std::string& op, int i, std::vector<std::string> inputs,
                                    const std::string& output, const std::string& suffix) {
  onnx::NodeProto* n = graph_->add_node();
  n->set_op_type(op);
  n->set_name(model_.layer(i).name() + suffix);
  for (const auto& in : inputs) n->add_input(in);
  n->add_output(output);
  return n;
}

void OnnxExporter::Ints(onnx::NodeProto* n, const char* name, std::vector<int64_t> v) {
  onnx::AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto_AttributeType_INTS);
  for (int64_t x : v) a->add_ints(x);
}

onnx::NodeProto* OnnxExporter::Int(onnx::NodeProto* n, const char* name, int64_t v) {
  onnx::AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto_AttributeType_INT);
  a->set_i(v);
  return n;
}

onnx::NodeProto* OnnxExporter::Float(onnx::NodeProto* n, const char* name, float v) {
  onnx::AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto_AttributeType_FLOAT);
  a->set_f(v);
  return n;
}

std::string OnnxExporter::Scalar(const std::string& name, float v) {
  onnx::TensorProto* t = graph_->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto_DataType_FLOAT);
  t->add_float_data(v);
  return name;
}

std::string OnnxExporter::Step(int i, const char* op, std::vector<std::string> in,
                               const std::string& tag, bool last) {
  const std::string out = last ? Out(i) : model_.layer(i).name() + "/" + tag;
  Node(op, i, std::move(in), out, "/" + tag);
  return out;
}

void OnnxExporter::Str(onnx::NodeProto* n, const char* name, const std::string& v) {
  onnx::AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto_AttributeType_STRING);
  a->set_s(v);
}

void OnnxExporter::AddLayer(int i) {
  const Layer& l = model_.layer(i);
  const OnnxExport* e = OnnxExportRegistry::Get().Find(l.type());
  if (e == nullptr || !e->convert) {
    throw Error(StrCat("layer '", l.name(), "' (", l.type(), ") has no ONNX export",
                       e == nullptr ? "" : StrCat(": ", e->schema.doc()),
                       "; exportable: ", ExportableTypes()));
  }
  e->convert(*this, i);
}

}  // namespace cnnflow::onnx_io
