// One ONNX node per cnnflow layer, in the model's order, each output named
// after its layer (the last one "logits"), weights as initializers under
// their state_dict names:
//   conv2d, conv1d   Conv (kernel_shape, strides, pads, dilations, group)
//   maxpool*d        MaxPool;  avgpool*d  AveragePool (count_include_pad)
//   batchnorm        BatchNormalization (running statistics, epsilon)
//   linear           Gemm (transB = 1: the weight is [out, in], as PyTorch's)
//   relu, add        Relu, Add;  flatten  Flatten (axis 1)
//   global_avgpool   GlobalAveragePool + Flatten: [N, C, ...] -> [N, C]
//   dropout          Identity (inference)
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
#include "ops/layers/adaptive_pool.h"
#include "ops/layers/batch_norm.h"
#include "ops/layers/conv1d.h"
#include "ops/layers/conv2d.h"
#include "ops/layers/conv_transpose2d.h"
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
    return i == model_.num_layers() - 1 ? std::string("logits") : model_.layer(i).name();
  }
  std::string In(int i, int k = 0) const {
    const std::string& n = model_.inputs_of(i)[k];
    if (n == kModelInput) return "input";
    const int last = model_.num_layers() - 1;
    return n == model_.layer(last).name() ? "logits" : n;
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

  // The layer's parameter or buffer `local` as an initializer; its name.
  std::string Weight(Layer& l, const std::string& local) {
    const std::string name = l.name() + "." + local;
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
  static void Int(onnx::NodeProto* n, const char* name, int64_t v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto_AttributeType_INT);
    a->set_i(v);
  }
  static void Float(onnx::NodeProto* n, const char* name, float v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto_AttributeType_FLOAT);
    a->set_f(v);
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
      std::string scale = l.name() + ".weight", bias = l.name() + ".bias";
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
      std::vector<std::string> in = {In(i), Weight(l, "weight")};
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
                         "global_avgpool, dropout, drop_path, adaptive_avgpool1d, "
                         "adaptive_avgpool2d (out 1 or dividing the input), upsample, "
                         "conv_transpose2d"));
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
                   std::nullopt, /*fuse_relu=*/false);
  const SafetensorsFile file = LoadSafetensors(weights);
  const std::string prefix = ema ? kEmaPrefix : "";
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, t] : model->StateTensors())
    if (const Tensor* f = file.Find(prefix + name)) tensors.emplace_back(name, *f);
  CopyNamedTensors(tensors, model->StateTensors(), weights);

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
