// One ONNX node per cnnflow layer, in the model's order, each output named
// after its layer (the last one "logits"), weights as initializers under
// their state_dict names:
//   conv2d, conv1d   Conv (kernel_shape, strides, pads, dilations, group)
//   maxpool*d        MaxPool;  avgpool*d  AveragePool (count_include_pad)
//   batchnorm        BatchNormalization (running statistics, epsilon)
//   linear           Gemm (transB = 1: the weight is [out, in], as PyTorch's), after
//                    a Flatten when the sample has more than one dimension
//   relu, add        Relu, Add;  flatten  Flatten (axis 1)
//   global_avgpool   GlobalAveragePool + Flatten: [N, C, ...] -> [N, C]
//   dropout          Identity (inference)
//   concat           Concat (axis 1)
//   mul              Mul (s unsqueezed to x's rank; a scale as a [1] initializer)
//   layer_scale      Mul by gamma [C, 1, 1] (initializer named as the layer)
//   channel_linear   Conv with a 1x1 kernel: weight [K, C] Unsqueezed to [K, C, 1, 1] (Gemm
//                    for [C] samples). One node that every runtime runs as a GEMM, where
//                    Transpose -> MatMul -> Add -> Transpose would be four; the
//                    initializer keeps the state_dict's [K, C] shape
//   layernorm        Transpose (channels last) -> LayerNormalization (axis -1) -> Transpose
//   groupnorm        Reshape [N, G, -1] -> InstanceNormalization -> Reshape -> Mul, Add
//                    (GroupNormalization is opset 18; weight and bias Unsqueezed to [C, 1, 1])
// A layer with a tensor named as the layer itself (layer_scale) has its
// output named "<layer>/output", since ONNX names are unique.
//   sigmoid, tanh, hardsigmoid, hardswish, leaky_relu   the ONNX op of that name
//   relu6            Clip (min 0, max 6);  silu  Sigmoid + Mul
//   gelu             opset 17 has no Gelu: x * 0.5 * (1 + Erf(x / sqrt 2)), or
//                    the tanh form, in elementwise nodes (as torch.onnx writes it)
//   adaptive_avgpool*d  GlobalAveragePool for out 1, AveragePool (kernel =
//                    stride = in / out) when out divides in, else an error
//   upsample         Resize (nearest: asymmetric + floor; bilinear: linear,
//                    half_pixel or align_corners), scales (or sizes) as an
//                    initializer
//   conv_transpose2d ConvTranspose (same weight layout as PyTorch's)
//   drop_path        Identity (inference)
// The batch dimension is symbolic ("N"). A ReLU cnnflow fuses into the
// layer before it is still its own Relu node here: fusion is only how the
// CPU runs it. The ONNX library builds the ModelProto, checks it
// (onnx::checker, full shape inference) and serialises it.
#include "tools/export_onnx.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "ops/io/file_write.h"
#include "ops/io/safetensors.h"
#include "ops/layers/activation.h"
#include "ops/layers/adaptive_pool.h"
#include "ops/layers/batch_norm.h"
#include "ops/layers/channel_linear.h"
#include "ops/layers/conv1d.h"
#include "ops/layers/conv2d.h"
#include "ops/layers/conv_transpose2d.h"
#include "ops/layers/group_norm.h"
#include "ops/layers/layer_norm.h"
#include "ops/layers/mul.h"
#include "ops/layers/pooling.h"
#include "ops/layers/pooling1d.h"
#include "ops/layers/upsample.h"
#include "ops/model.h"
#include "ops/train/weight_average.h"
#include "pipeline/run_config.h"
#include "pipeline/trainer.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

constexpr int kOpset = 17;

constexpr const char* kExportUsage =
    R"(usage: cnnflow export RUN_DIR|CONFIG [--weights FILE] -o MODEL.onnx [--ema] [--set key=value ...]
                      [--check N FILE.safetensors]

  RUN_DIR             a run folder: its config.yaml, and model.safetensors unless --weights
  CONFIG --weights W  a config and the weights to export (a run's model.safetensors)
  -o MODEL.onnx       the ONNX file (opset 17; input "input" [N, ...], output "logits")
  --ema               export the weight average (the ema stage's "ema.*" tensors)
  --check N FILE      also write the first N test samples (as the model sees them,
                      normalised) and cnnflow's logits for them to FILE (safetensors:
                      "input", "logits"), to compare with an ONNX runtime
)";

struct UsageError : Error {
  using Error::Error;
};

class Exporter {
 public:
  Exporter(Model& model, const std::string& name) : model_(model) {
    proto_.set_ir_version(8);  // the IR of opset 17 (ONNX 1.12)
    proto_.set_producer_name("cnnflow");
    proto_.set_model_version(1);
    onnx::OperatorSetIdProto* op = proto_.add_opset_import();
    op->set_domain("");
    op->set_version(kOpset);
    graph_ = proto_.mutable_graph();
    graph_->set_name(name);
  }

  onnx::ModelProto Build() {
    AddValueInfo(graph_->add_input(), "input", model_.input_shape());
    for (int i = 0; i < model_.num_layers(); ++i) AddLayer(i);
    AddValueInfo(graph_->add_output(), "logits", model_.output_shape());
    return proto_;
  }

 private:
  std::string Out(int i) const {
    if (i == model_.num_layers() - 1) return "logits";
    Layer& l = model_.layer(i);
    for (const Parameter& p : l.parameters())
      if (p.name.empty()) return l.name() + "/output";  // the layer's name is its tensor's
    return l.name();
  }
  // The layer that input k of layer i reads (-1: the model input).
  int Source(int i, int k) const {
    const std::string& n = model_.inputs_of(i)[k];
    for (int j = 0; j < i; ++j)
      if (model_.layer(j).name() == n) return j;
    return -1;
  }
  std::string In(int i, int k = 0) const {
    const int j = Source(i, k);
    return j < 0 ? std::string("input") : Out(j);
  }
  // The sample shape of input k of layer i.
  Shape InShape(int i, int k = 0) const {
    const int j = Source(i, k);
    return j < 0 ? model_.input_shape() : model_.output_shape(j);
  }

  static void AddValueInfo(onnx::ValueInfoProto* v, const std::string& name, const Shape& sample) {
    v->set_name(name);
    onnx::TypeProto_Tensor* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto_DataType_FLOAT);
    onnx::TensorShapeProto* s = t->mutable_shape();
    s->add_dim()->set_dim_param("N");
    for (int64_t d : sample.dims()) s->add_dim()->set_dim_value(d);
  }

  // An initializer named `name` from a host f32 (or f64, cast) tensor.
  void AddInitializer(const std::string& name, const Tensor& value) {
    const Tensor host = value.To(Device::Cpu());
    const Tensor f = host.dtype() == DType::kF32 ? host : host.Cast(DType::kF32);
    onnx::TensorProto* t = graph_->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto_DataType_FLOAT);
    for (int64_t d : f.shape().dims()) t->add_dims(d);
    t->set_raw_data(f.raw_data(), f.nbytes());  // little-endian, as ONNX stores raw data
  }
  void AddFilled(const std::string& name, int64_t n, float v) {
    Tensor t = Tensor::Full(Shape{n}, v, DType::kF32);
    AddInitializer(name, t);
  }
  // A 1D int64 initializer (Reshape's shape, Unsqueeze's axes).
  void AddInts(const std::string& name, const std::vector<int64_t>& v) {
    onnx::TensorProto* t = graph_->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto_DataType_INT64);
    t->add_dims(static_cast<int64_t>(v.size()));
    for (int64_t x : v) t->add_int64_data(x);
  }
  // `value` (a tensor of rank `rank`, with the batch dimension if it has
  // one) with axes [rank, rank + extra) of size 1 appended; its name.
  std::string Unsqueezed(int i, const std::string& value, int rank, int extra,
                         const std::string& suffix) {
    if (extra <= 0) return value;
    std::vector<int64_t> axes;
    for (int a = rank; a < rank + extra; ++a) axes.push_back(a);
    const std::string out = model_.layer(i).name() + "/" + suffix;
    AddInts(out + "_axes", axes);
    Node("Unsqueeze", i, {value, out + "_axes"}, out, "/" + suffix);
    return out;
  }
  // The layer's weight and bias, or ones and zeros without an affine map.
  std::pair<std::string, std::string> AffineOrIdentity(Layer& l, bool affine, int64_t channels) {
    if (affine) return {Weight(l, "weight"), Weight(l, "bias")};
    const std::string w = TensorName(l.name(), "weight"), b = TensorName(l.name(), "bias");
    AddFilled(w, channels, 1);
    AddFilled(b, channels, 0);
    return {w, b};
  }

  // The layer's parameter or buffer `local` as an initializer; its name.
  std::string Weight(Layer& l, const std::string& local) {
    const std::string name = TensorName(l.name(), local);
    for (const Parameter& p : l.parameters())
      if (p.name == local) return AddInitializer(name, p.value), name;
    for (const Buffer& b : l.buffers())
      if (b.name == local) return AddInitializer(name, b.value), name;
    throw Error(StrCat("layer '", l.name(), "' has no tensor '", local, "'"));
  }

  onnx::NodeProto* Node(const std::string& op, int i, std::vector<std::string> inputs,
                        const std::string& output, const std::string& suffix = "") {
    onnx::NodeProto* n = graph_->add_node();
    n->set_op_type(op);
    n->set_name(model_.layer(i).name() + suffix);
    for (const auto& in : inputs) n->add_input(in);
    n->add_output(output);
    return n;
  }
  static void Ints(onnx::NodeProto* n, const char* name, std::vector<int64_t> v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto_AttributeType_INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  static onnx::NodeProto* Int(onnx::NodeProto* n, const char* name, int64_t v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto_AttributeType_INT);
    a->set_i(v);
    return n;
  }
  static onnx::NodeProto* Float(onnx::NodeProto* n, const char* name, float v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto_AttributeType_FLOAT);
    a->set_f(v);
    return n;
  }

  void AddLayer(int i) {
    Layer& l = model_.layer(i);
    const std::string type = l.type();
    if (type == "conv2d" || type == "conv1d") {
      const Conv2dGeometry& g = static_cast<Conv2d&>(l).geometry();
      std::vector<std::string> in = {In(i), Weight(l, "weight")};
      if (static_cast<Conv2d&>(l).has_bias()) in.push_back(Weight(l, "bias"));
      onnx::NodeProto* n = Node("Conv", i, in, Out(i));
      if (type == "conv1d") {  // a [C, 1, L] conv with a 1 x k kernel inside cnnflow
        Ints(n, "kernel_shape", {g.kernel_w});
        Ints(n, "strides", {g.stride_w});
        Ints(n, "pads", {g.pad_w, g.pad_w});
        Ints(n, "dilations", {g.dilation_w});
      } else {
        Ints(n, "kernel_shape", {g.kernel_h, g.kernel_w});
        Ints(n, "strides", {g.stride_h, g.stride_w});
        Ints(n, "pads", {g.pad_h, g.pad_w, g.pad_h, g.pad_w});
        Ints(n, "dilations", {g.dilation_h, g.dilation_w});
      }
      Int(n, "group", g.groups);
    } else if (type == "maxpool2d" || type == "avgpool2d") {
      const Pool2dGeometry& g = static_cast<Pool2dBase&>(l).geometry();
      onnx::NodeProto* n =
          Node(type == "maxpool2d" ? "MaxPool" : "AveragePool", i, {In(i)}, Out(i));
      Ints(n, "kernel_shape", {g.kernel_h, g.kernel_w});
      Ints(n, "strides", {g.stride_h, g.stride_w});
      Ints(n, "pads", {g.pad_h, g.pad_w, g.pad_h, g.pad_w});
      if (type == "avgpool2d")
        Int(n, "count_include_pad", static_cast<AvgPool2d&>(l).count_include_pad());
    } else if (type == "maxpool1d" || type == "avgpool1d") {
      const Pool1dGeometry& g = static_cast<Pool1dBase&>(l).geometry();
      onnx::NodeProto* n =
          Node(type == "maxpool1d" ? "MaxPool" : "AveragePool", i, {In(i)}, Out(i));
      Ints(n, "kernel_shape", {g.kernel});
      Ints(n, "strides", {g.stride});
      Ints(n, "pads", {g.pad, g.pad});
      if (type == "avgpool1d")
        Int(n, "count_include_pad", static_cast<AvgPool1d&>(l).count_include_pad());
    } else if (type == "batchnorm") {
      auto& bn = static_cast<BatchNormLayer&>(l);
      std::string scale = TensorName(l.name(), "weight"), bias = TensorName(l.name(), "bias");
      if (bn.affine()) {
        Weight(l, "weight");
        Weight(l, "bias");
      } else {  // no affine map: scale 1, shift 0
        AddFilled(scale, bn.channels(), 1);
        AddFilled(bias, bn.channels(), 0);
      }
      onnx::NodeProto* n =
          Node("BatchNormalization", i,
               {In(i), scale, bias, Weight(l, "running_mean"), Weight(l, "running_var")}, Out(i));
      Float(n, "epsilon", static_cast<float>(bn.eps()));
    } else if (type == "linear") {
      std::string x = In(i);
      if (InShape(i).rank() > 1) {  // cnnflow's linear flattens a sample; Gemm takes [N, F]
        x = l.name() + "/flat";
        Int(Node("Flatten", i, {In(i)}, x, "/flatten"), "axis", 1);
      }
      std::vector<std::string> in = {x, Weight(l, "weight")};
      bool bias = false;
      for (const Parameter& p : l.parameters()) bias = bias || p.name == "bias";
      if (bias) in.push_back(Weight(l, "bias"));
      Int(Node("Gemm", i, in, Out(i)), "transB", 1);
    } else if (type == "relu") {
      Node("Relu", i, {In(i)}, Out(i));
    } else if (type == "add") {
      Node("Add", i, {In(i, 0), In(i, 1)}, Out(i));
    } else if (type == "flatten") {
      Int(Node("Flatten", i, {In(i)}, Out(i)), "axis", 1);
    } else if (type == "global_avgpool") {
      const std::string pooled = l.name() + "/pooled";
      Node("GlobalAveragePool", i, {In(i)}, pooled);
      Int(Node("Flatten", i, {pooled}, Out(i), "/flatten"), "axis", 1);
    } else if (type == "dropout" || type == "drop_path") {
      Node("Identity", i, {In(i)}, Out(i));
    } else if (type == "concat") {
      std::vector<std::string> in;
      for (size_t k = 0; k < model_.inputs_of(i).size(); ++k)
        in.push_back(In(i, static_cast<int>(k)));
      Int(Node("Concat", i, in, Out(i)), "axis", 1);
    } else if (type == "mul") {
      auto& m = static_cast<MulLayer&>(l);
      if (m.has_scale()) {
        const std::string a = l.name() + "/scale";
        AddInitializer(a, Tensor::Full(Shape{1}, m.scale(), DType::kF32));
        Node("Mul", i, {In(i), a}, Out(i));
      } else {  // s [N, C] for x [N, C, H, W]: unsqueezed, NumPy broadcasting does the rest
        const int sr = InShape(i, 1).rank() + 1, xr = InShape(i, 0).rank() + 1;
        Node("Mul", i, {In(i, 0), Unsqueezed(i, In(i, 1), sr, xr - sr, "s")}, Out(i));
      }
    } else if (type == "layer_scale") {
      Node("Mul", i, {In(i), Weight(l, "")}, Out(i));
    } else if (type == "channel_linear") {
      auto& cl = static_cast<ChannelLinearLayer&>(l);
      std::vector<std::string> in = {In(i), Weight(l, "weight")};
      if (cl.has_bias()) in.push_back(Weight(l, "bias"));
      const int spatial = InShape(i).rank() - 1;
      if (spatial == 0) {  // [C] samples: nn.Linear itself
        Int(Node("Gemm", i, in, Out(i)), "transB", 1);
      } else {
        in[1] = Unsqueezed(i, in[1], 2, spatial, "kernel");
        Ints(Node("Conv", i, in, Out(i)), "kernel_shape", std::vector<int64_t>(spatial, 1));
      }
    } else if (type == "layernorm") {
      auto& ln = static_cast<LayerNormLayer&>(l);
      const auto [w, b] = AffineOrIdentity(l, ln.affine(), ln.channels());
      const int r = InShape(i).rank() + 1;  // with the batch
      if (r == 2) {
        Float(Int(Node("LayerNormalization", i, {In(i), w, b}, Out(i)), "axis", -1), "epsilon",
              static_cast<float>(ln.eps()));
      } else {
        std::vector<int64_t> last = {0}, back = {0, r - 1};  // channels last, and back
        for (int a = 2; a < r; ++a) last.push_back(a);
        last.push_back(1);
        for (int a = 1; a < r - 1; ++a) back.push_back(a);
        const std::string t = l.name() + "/channels_last", n = l.name() + "/normalised";
        Ints(Node("Transpose", i, {In(i)}, t, "/channels_last"), "perm", last);
        Float(Int(Node("LayerNormalization", i, {t, w, b}, n, "/normalise"), "axis", -1), "epsilon",
              static_cast<float>(ln.eps()));
        Ints(Node("Transpose", i, {n}, Out(i)), "perm", back);
      }
    } else if (type == "groupnorm") {
      auto& gn = static_cast<GroupNormLayer&>(l);
      const Shape s = InShape(i);
      const std::string grouped = l.name() + "/grouped", normed = l.name() + "/normalised";
      const std::string ones = l.name() + "/ones", zeros = l.name() + "/zeros";
      AddInts(grouped + "_shape", {0, gn.groups(), -1});
      Node("Reshape", i, {In(i), grouped + "_shape"}, grouped, "/group");
      AddFilled(ones, gn.groups(), 1);
      AddFilled(zeros, gn.groups(), 0);
      Float(Node("InstanceNormalization", i, {grouped, ones, zeros}, normed, "/normalise"),
            "epsilon", static_cast<float>(gn.eps()));
      std::vector<int64_t> shape = {0};
      for (int64_t d : s.dims()) shape.push_back(d);
      const std::string back = gn.affine() ? l.name() + "/ungrouped" : Out(i);
      AddInts(l.name() + "/ungrouped_shape", shape);
      Node("Reshape", i, {normed, l.name() + "/ungrouped_shape"}, back, "/ungroup");
      if (gn.affine()) {
        const int extra = s.rank() - 1;  // [C] -> [C, 1, 1]
        const std::string scaled = l.name() + "/scaled";
        Node("Mul", i, {back, Unsqueezed(i, Weight(l, "weight"), 1, extra, "weight")}, scaled,
             "/scale");
        Node("Add", i, {scaled, Unsqueezed(i, Weight(l, "bias"), 1, extra, "bias")}, Out(i));
      }
    } else if (auto* act = dynamic_cast<ActivationLayer*>(&l)) {
      AddActivation(i, *act);
    } else if (type == "adaptive_avgpool2d" || type == "adaptive_avgpool1d") {
      AddAdaptivePool(i, static_cast<AdaptiveAvgPool&>(l));
    } else if (type == "upsample") {
      AddUpsample(i, static_cast<Upsample&>(l));
    } else if (type == "conv_transpose2d") {
      auto& ct = static_cast<ConvTranspose2d&>(l);
      const Conv2dGeometry& g = ct.dual();
      std::vector<std::string> in = {In(i), Weight(l, "weight")};
      if (ct.has_bias()) in.push_back(Weight(l, "bias"));
      onnx::NodeProto* n = Node("ConvTranspose", i, in, Out(i));
      Ints(n, "kernel_shape", {g.kernel_h, g.kernel_w});
      Ints(n, "strides", {g.stride_h, g.stride_w});
      Ints(n, "pads", {g.pad_h, g.pad_w, g.pad_h, g.pad_w});
      Ints(n, "dilations", {g.dilation_h, g.dilation_w});
      Ints(n, "output_padding", {ct.output_pad_h(), ct.output_pad_w()});
      Int(n, "group", g.groups);
    } else {
      throw Error(StrCat("layer '", l.name(), "' (", type,
                         ") has no ONNX export; exportable: conv1d, conv2d, maxpool1d, maxpool2d, "
                         "avgpool1d, avgpool2d, batchnorm, linear, relu, add, flatten, "
                         "global_avgpool, dropout, concat, mul, layer_scale, channel_linear, "
                         "layernorm, groupnorm, gelu, silu, sigmoid, tanh, hardsigmoid, "
                         "hardswish, relu6, leaky_relu, drop_path, adaptive_avgpool1d, "
                         "adaptive_avgpool2d (out 1 or dividing the input), upsample, "
                         "conv_transpose2d"));
    }
  }

  // A scalar (0-d) f32 initializer named `name` (Clip's bounds must be
  // 0-d); its name.
  std::string Scalar(const std::string& name, float v) {
    onnx::TensorProto* t = graph_->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto_DataType_FLOAT);
    t->add_float_data(v);
    return name;
  }

  // One node of a layer made of several: its output "<layer>/<tag>"
  // (`last`: the layer's output).
  std::string Step(int i, const char* op, std::vector<std::string> in, const std::string& tag,
                   bool last = false) {
    const std::string out = last ? Out(i) : model_.layer(i).name() + "/" + tag;
    Node(op, i, std::move(in), out, "/" + tag);
    return out;
  }

  void AddActivation(int i, const ActivationLayer& l) {
    const std::string x = In(i), c = l.name() + "/";
    switch (l.kind()) {
      case Activation::kGeluErf: {  // x * 0.5 * (1 + Erf(x / sqrt 2))
        const std::string e =
            Step(i, "Erf", {Step(i, "Div", {x, Scalar(c + "sqrt2", 1.41421356f)}, "div")}, "erf");
        const std::string xm =
            Step(i, "Mul", {x, Step(i, "Add", {e, Scalar(c + "one", 1)}, "add")}, "mul");
        Step(i, "Mul", {xm, Scalar(c + "half", 0.5f)}, "half", true);
        return;
      }
      case Activation::kGeluTanh: {  // x * 0.5 * (1 + Tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        const std::string x3 = Step(i, "Mul", {Step(i, "Mul", {x, x}, "sq"), x}, "cube");
        const std::string inner =
            Step(i, "Add", {x, Step(i, "Mul", {x3, Scalar(c + "c", 0.044715f)}, "cubic")}, "inner");
        const std::string t = Step(
            i, "Tanh", {Step(i, "Mul", {inner, Scalar(c + "k", 0.7978845608f)}, "scaled")}, "tanh");
        const std::string xm =
            Step(i, "Mul", {x, Step(i, "Add", {t, Scalar(c + "one", 1)}, "add")}, "mul");
        Step(i, "Mul", {xm, Scalar(c + "half", 0.5f)}, "half", true);
        return;
      }
      case Activation::kSilu:
        Step(i, "Mul", {x, Step(i, "Sigmoid", {x}, "sigmoid")}, "mul", true);
        return;
      case Activation::kSigmoid:
        Node("Sigmoid", i, {x}, Out(i));
        return;
      case Activation::kTanh:
        Node("Tanh", i, {x}, Out(i));
        return;
      case Activation::kHardsigmoid: {
        onnx::NodeProto* n = Node("HardSigmoid", i, {x}, Out(i));
        Float(n, "alpha", 1.f / 6);
        Float(n, "beta", 0.5f);
        return;
      }
      case Activation::kHardswish:
        Node("HardSwish", i, {x}, Out(i));
        return;
      case Activation::kRelu6:
        Node("Clip", i, {x, Scalar(c + "min", 0), Scalar(c + "max", 6)}, Out(i));
        return;
      case Activation::kLeakyRelu:
        Float(Node("LeakyRelu", i, {x}, Out(i)), "alpha", static_cast<float>(l.alpha()));
        return;
    }
  }

  // GlobalAveragePool (out 1 everywhere) or AveragePool with kernel =
  // stride = in / out (out divides in): then the bins are exactly those
  // windows. Other sizes have overlapping bins of varying size that no
  // ONNX pooling expresses.
  void AddAdaptivePool(int i, AdaptiveAvgPool& l) {
    const AdaptivePoolGeometry& g = l.geometry();
    const bool two = l.rank() == 3;
    if (g.out_h == 1 && g.out_w == 1) {
      Node("GlobalAveragePool", i, {In(i)}, Out(i));
      return;
    }
    if (g.in_h % g.out_h != 0 || g.in_w % g.out_w != 0) {
      throw Error(StrCat("layer '", l.name(), "' (", l.type(), ") has no ONNX export for input ",
                         two ? StrCat(g.in_h, "x", g.in_w) : StrCat(g.in_w), " -> output ",
                         two ? StrCat(g.out_h, "x", g.out_w) : StrCat(g.out_w),
                         ": the output size must divide the input size (an AveragePool) or be "
                         "1 (a GlobalAveragePool)"));
    }
    onnx::NodeProto* n = Node("AveragePool", i, {In(i)}, Out(i));
    const int64_t kh = g.in_h / g.out_h, kw = g.in_w / g.out_w;
    if (two) {
      Ints(n, "kernel_shape", {kh, kw});
      Ints(n, "strides", {kh, kw});
    } else {
      Ints(n, "kernel_shape", {kw});
      Ints(n, "strides", {kw});
    }
  }

  // Resize (opset 11+): inputs X, roi (unused), scales or sizes. PyTorch
  // uses 1/scale as the coordinate ratio when a scale is given, in/out when
  // a size is, as ONNX does with scales / sizes.
  void AddUpsample(int i, Upsample& l) {
    onnx::NodeProto* n = nullptr;
    if (l.scale_h() > 0) {
      const std::string scales = l.name() + "/scales";
      Tensor s = Tensor::Empty(Shape{4}, DType::kF32);
      const float values[4] = {1.f, 1.f, static_cast<float>(l.scale_h()),
                               static_cast<float>(l.scale_w())};
      std::memcpy(s.raw_data(), values, sizeof(values));
      AddInitializer(scales, s);
      n = Node("Resize", i, {In(i), "", scales}, Out(i));
    } else {
      // sizes = [N, C] of the input (N is symbolic) ++ [H', W'].
      const std::string p = l.name() + "/";
      AddInt64(p + "zero", {0});
      AddInt64(p + "two", {2});
      AddInt64(p + "out_hw", {l.out_h(), l.out_w()});
      Node("Shape", i, {In(i)}, p + "shape", "/shape");
      Node("Slice", i, {p + "shape", p + "zero", p + "two"}, p + "nc", "/nc");
      Int(Node("Concat", i, {p + "nc", p + "out_hw"}, p + "sizes", "/sizes"), "axis", 0);
      n = Node("Resize", i, {In(i), "", "", p + "sizes"}, Out(i));
    }
    if (l.bilinear()) {
      Str(n, "mode", "linear");
      Str(n, "coordinate_transformation_mode", l.align_corners() ? "align_corners" : "half_pixel");
    } else {
      Str(n, "mode", "nearest");
      Str(n, "coordinate_transformation_mode", "asymmetric");
      Str(n, "nearest_mode", "floor");
    }
  }
  void AddInt64(const std::string& name, const std::vector<int64_t>& values) {
    onnx::TensorProto* t = graph_->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto_DataType_INT64);
    t->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values) t->add_int64_data(v);
  }
  static void Str(onnx::NodeProto* n, const char* name, const std::string& v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto_AttributeType_STRING);
    a->set_s(v);
  }

  Model& model_;
  onnx::ModelProto proto_;
  onnx::GraphProto* graph_ = nullptr;
};

// The first n test samples (train without a test set) as the model reads
// them, and the logits of `model` for them.
void WriteCheck(Trainer& trainer, int64_t n, const std::string& path) {
  RunState& state = trainer.state();
  const Dataset& data = state.dataset(state.datasets.count("test") ? "test" : "train");
  n = std::min(n, data.size());
  const Shape sample = data.sample_shape();
  Tensor x = Tensor::Empty(sample.WithBatch(n), DType::kF32);
  float* dst = x.data<float>();
  const ReadContext ctx{state.seed, 0, false};
  for (int64_t i = 0; i < n; ++i) {
    const ReadResult r = data.Read(i, ctx, dst + i * sample.numel());
    if (!r.ok()) throw Error(StrCat("sample ", data.Key(i), ": ", r.error));
    if (!data.normalizes()) state.transform.Apply(dst + i * sample.numel(), sample);
  }
  ForwardContext fc;
  fc.training = false;
  fc.keep_activations = false;
  Model& model = trainer.model();
  const Tensor logits =
      model.Forward(model.device().is_cuda() ? x.To(model.device()) : x, fc).To(Device::Cpu());
  SaveSafetensors(path, {{"input", x}, {"logits", logits}}, {{"samples", std::to_string(n)}});
}

int Export(const std::vector<std::string>& args) {
  std::string source, weights, out, check_path;
  int64_t check_n = 0;
  bool ema = false;
  std::vector<std::string> sets;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw UsageError(StrCat(a, " needs a value"));
      return args[++i];
    };
    if (a == "--weights") {
      weights = value();
    } else if (a == "-o" || a == "--out") {
      out = value();
    } else if (a == "--set") {
      sets.push_back(value());
    } else if (a == "--ema") {
      ema = true;
    } else if (a == "--check") {
      const std::string n = value();
      char* end = nullptr;
      check_n = std::strtoll(n.c_str(), &end, 10);
      if (n.empty() || *end != '\0' || check_n <= 0)
        throw UsageError("--check needs a count N > 0");
      check_path = value();
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError(StrCat("unknown option '", a, "'"));
    } else if (source.empty()) {
      source = a;
    } else {
      throw UsageError(StrCat("unexpected argument '", a, "'"));
    }
  }
  if (source.empty()) throw UsageError("needs a RUN_DIR or a CONFIG");
  if (out.empty()) throw UsageError("needs -o MODEL.onnx");
  std::string config = source;
  if (fs::is_directory(source)) {
    config = (fs::path(source) / "config.yaml").string();
    if (!fs::exists(config)) throw Error(StrCat(source, ": no config.yaml (not a run folder?)"));
    if (weights.empty()) weights = (fs::path(source) / "model.safetensors").string();
  } else if (!fs::exists(source)) {
    throw Error(StrCat(source, ": no such run folder or config file"));
  }
  if (weights.empty())
    throw UsageError("a CONFIG needs --weights FILE (a run's model.safetensors)");

  RunConfig rc = LoadRunConfig(config, sets);
  // The model alone, on the CPU, every ReLU a layer: what ONNX describes.
  std::unique_ptr<Model> model =
      Model::Build(rc.layers, rc.input_shape, DType::kF32, rc.seed, rc.init, Device::Cpu(),
                   std::nullopt, /*fuse_activations=*/false);
  const std::string prefix = ema ? kEmaPrefix : "";
  StateDictRules rules;
  rules.prefix = prefix;
  LoadStateDict(LoadSafetensors(weights).tensors, {model.get()}, rules, weights);

  onnx::ModelProto proto = Exporter(*model, rc.name).Build();
  proto.set_doc_string(StrCat("cnnflow config ", rc.name, " (", config, "), weights ", weights));
  onnx::checker::check_model(proto);
  onnx::shape_inference::InferShapes(proto, onnx::OpSchemaRegistry::Instance(),
                                     onnx::ShapeInferenceOptions(true, 1, true));
  std::string bytes;
  if (!proto.SerializeToString(&bytes)) throw Error("cannot serialise the ONNX model");
  WriteFileAtomically(out, bytes);
  std::printf(
      "wrote %s: %s, %d layers -> %d ONNX nodes, %d initializers, opset %d, input [N, %s], "
      "output logits [N, %s]\n",
      out.c_str(), rc.name.c_str(), model->num_layers(), proto.graph().node_size(),
      proto.graph().initializer_size(), kOpset,
      [&] {
        std::string s;
        for (int64_t d : model->input_shape().dims())
          s += (s.empty() ? "" : ", ") + std::to_string(d);
        return s;
      }()
          .c_str(),
      std::to_string(model->output_shape()[0]).c_str());
  if (check_n > 0) {
    Trainer trainer(std::move(rc));
    trainer.LoadWeights(weights, prefix);
    WriteCheck(trainer, check_n, check_path);
    std::printf("wrote %s: %lld samples and cnnflow's logits\n", check_path.c_str(),
                static_cast<long long>(check_n));
  }
  return 0;
}

}  // namespace

int RunExport(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") return std::printf("%s", kExportUsage), 0;
  }
  try {
    return Export(args);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "cnnflow export: %s\n\n%s", e.what(), kExportUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cnnflow export: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace cnnflow
