// `cnnflow import` without PyTorch: tests/data/onnx/ holds small networks
// exported by torch.onnx (tests/data/make_onnx_fixtures.py writes them) with
// an input and PyTorch's float64 logits and gradients. Each imports, loads
// its own weights strictly by PyTorch's names, and gives PyTorch's logits
// in evaluation and training mode and its parameter gradients. Bad files
// and ops without a layer are named errors, and a failed import leaves no
// folder behind. bench/onnx_import_vs_pytorch.py checks torchvision's
// full-size networks.
#include "onnx/import.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "onnx/importer.h"
#include "ops/io/safetensors.h"
#include "ops/loss.h"
#include "ops/model.h"
#include "pipeline/run_config.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

std::string Fixture(const std::string& file) {
  const char* src = std::getenv("CNNFLOW_SOURCE_DIR");
  return (fs::path(src != nullptr ? src : ".") / "tests" / "data" / "onnx" / file).string();
}

std::string ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

ImportedOnnx ImportFile(const std::string& path) {
  const std::string b = ReadBytes(path);
  return ImportOnnx(b.data(), b.size(), path);
}

// ||a - b|| / max(||b||, floor)
double RelativeError(const Tensor& a, const Tensor& b, double floor = 1e-30) {
  EXPECT_EQ(a.shape(), b.shape());
  double d = 0, n = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    d += (a.At(i) - b.At(i)) * (a.At(i) - b.At(i));
    n += b.At(i) * b.At(i);
  }
  return std::sqrt(d) / std::max(std::sqrt(n), floor);
}

double Norm(const Tensor& t) {
  double n = 0;
  for (int64_t i = 0; i < t.numel(); ++i) n += t.At(i) * t.At(i);
  return std::sqrt(n);
}

// The imported model, built and loaded strictly with its own tensors.
std::unique_ptr<Model> BuildImported(const ImportedOnnx& m) {
  auto model = Model::Build(m.layers, m.input_shape);
  LoadStateDict(m.tensors, {model.get()}, {}, "the import");
  return model;
}

class OnnxFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(OnnxFixture, GivesPyTorchsLogitsAndGradients) {
  const ImportedOnnx m = ImportFile(Fixture(GetParam() + ".onnx"));
  const SafetensorsFile ref = LoadSafetensors(Fixture(GetParam() + ".check.safetensors"));
  auto model = BuildImported(m);
  const Tensor x = ref.Find("input")->Cast(DType::kF32);
  ForwardContext eval;
  eval.training = false;
  EXPECT_LE(RelativeError(model->Forward(x, eval), *ref.Find("logits")), 1e-4);

  ForwardContext train;
  const Tensor logits = model->Forward(x, train).Clone();
  EXPECT_LE(RelativeError(logits, *ref.Find("logits_train")), 1e-4);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < ref.Find("labels")->numel(); ++i)
    labels.push_back(static_cast<int64_t>(ref.Find("labels")->At(i)));
  Tensor dlogits = Tensor::Empty(logits.shape(), logits.dtype());
  SoftmaxCrossEntropy(logits, labels.data(), &dlogits);
  model->ZeroGrad();
  model->Backward(dlogits);

  // Every parameter under its PyTorch name, with PyTorch's gradient. A
  // gradient that is zero in exact arithmetic (the bias of a conv that
  // training-mode BN follows) is rounding noise in f32: errors are taken
  // relative to at least 1e-3 of the largest gradient's norm.
  double largest = 0;
  for (const auto& [name, t] : ref.tensors)
    if (name.rfind("grad.", 0) == 0) largest = std::max(largest, Norm(t));
  std::set<std::string> checked;
  for (const auto& np : model->NamedParameters()) {
    const Tensor* g = ref.Find("grad." + np.name);
    ASSERT_NE(g, nullptr) << np.name << " is not a PyTorch parameter name";
    EXPECT_LE(RelativeError(np.param->grad, *g, 1e-3 * largest), 1e-4) << np.name;
    checked.insert(np.name);
  }
  for (const auto& [name, t] : ref.tensors) {
    if (name.rfind("grad.", 0) == 0) {
      EXPECT_TRUE(checked.count(name.substr(5))) << name << " not imported";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TorchOnnx, OnnxFixture,
                         ::testing::Values("resnet_block", "inverted_residual_se_silu", "gelu_net",
                                           "zoo_net", "shuffle_net", "shuffle_unit",
                                           "ceil_pool_net", "convnext_net"));

TEST(ImportOnnx, MapsExporterPatternsToSingleLayers) {
  auto types = [](const ImportedOnnx& m) {
    std::multiset<std::string> t;
    for (const LayerSpec& s : m.layers) t.insert(s.type);
    return t;
  };
  const auto se = types(ImportFile(Fixture("inverted_residual_se_silu.onnx")));
  EXPECT_EQ(se.count("silu"), 4u);   // Sigmoid + Mul
  EXPECT_EQ(se.count("relu6"), 1u);  // Clip [0, 6]
  EXPECT_EQ(se.count("mul"), 1u);    // the SE gate
  EXPECT_EQ(se.count("sigmoid"), 1u);
  EXPECT_EQ(se.count("global_avgpool"), 1u);      // GlobalAveragePool + Flatten
  EXPECT_EQ(se.count("adaptive_avgpool2d"), 1u);  // the SE's pool, [C, 1, 1]
  const ImportedOnnx gelu = ImportFile(Fixture("gelu_net.onnx"));
  EXPECT_EQ(types(gelu).count("gelu"), 2u);  // erf (5 nodes) and tanh (9 nodes)
  EXPECT_EQ(gelu.layers.size(), 8u);
  // ShuffleNet's channel shuffle (view, transpose, view): one layer, whether
  // the view sizes are constants (batch fixed) or computed from Shape nodes
  // (a dynamic batch: the shape arithmetic is folded).
  for (const std::string name : {"shuffle_net", "shuffle_net_dynamic"}) {
    const ImportedOnnx shuffle = ImportFile(Fixture(name + ".onnx"));
    EXPECT_EQ(types(shuffle).count("channel_shuffle"), 1u) << name;
    EXPECT_EQ(shuffle.layers.size(), 9u) << name;
    for (const LayerSpec& s : shuffle.layers) {
      if (s.type == "channel_shuffle") {
        EXPECT_EQ(s.args.Int("groups"), 2);
      }
    }
    const SafetensorsFile ref = LoadSafetensors(Fixture(name + ".check.safetensors"));
    ForwardContext eval;
    eval.training = false;
    EXPECT_LE(
        RelativeError(BuildImported(shuffle)->Forward(ref.Find("input")->Cast(DType::kF32), eval),
                      *ref.Find("logits")),
        1e-4)
        << name;
  }
  const ImportedOnnx zoo = ImportFile(Fixture("zoo_net.onnx"));
  const auto z = types(zoo);
  for (const char* t :
       {"leaky_relu", "conv_transpose2d", "hardswish", "avgpool2d", "upsample", "hardsigmoid",
        "concat", "layer_scale", "mul", "global_avgpool", "linear"}) {
    EXPECT_EQ(z.count(t), 1u) << t;
  }
  // The final Softmax is left out, and said so.
  ASSERT_EQ(zoo.notes.size(), 1u);
  EXPECT_NE(zoo.notes[0].find("the final Softmax is left out"), std::string::npos) << zoo.notes[0];
}

// BN folded into the convs, by the TorchScript exporter's constant folding
// or by the newer exporter's optimiser: convs with biases, PyTorch's eval
// logits, the layers named after the modules where the file records them
// (node names; the newer exporter's metadata).
class FoldedFixture : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(FoldedFixture, ImportsAsItIs) {
  const auto& [name, first_layer] = GetParam();
  const ImportedOnnx m = ImportFile(Fixture(name + ".onnx"));
  for (const LayerSpec& s : m.layers) EXPECT_NE(s.type, "batchnorm");
  const SafetensorsFile ref = LoadSafetensors(Fixture(name + ".check.safetensors"));
  auto model = BuildImported(m);
  ForwardContext eval;
  eval.training = false;
  EXPECT_LE(RelativeError(model->Forward(ref.Find("input")->Cast(DType::kF32), eval),
                          *ref.Find("logits")),
            1e-4);
  EXPECT_EQ(m.layers[0].name, first_layer);
  EXPECT_EQ(m.tensors[0].first, first_layer + ".weight");
  EXPECT_EQ(m.tensors[1].first, first_layer + ".bias");
}

INSTANTIATE_TEST_SUITE_P(TorchOnnx, FoldedFixture,
                         ::testing::Values(std::make_pair("resnet_block_folded", "conv1"),
                                           std::make_pair("inverted_residual_se_silu_dynamo",
                                                          "features.0.0")));

// Layers are named after PyTorch's module paths, whose keys may hold '-'
// (RegNet's trunk_output.block1.block1-0), so that the weights keep them.
TEST(ImportOnnx, ModulePathsMayHoldHyphens) {
  EXPECT_TRUE(onnx_io::IsModulePath("trunk_output.block1.block1-0.proj.0"));
  EXPECT_TRUE(onnx_io::IsModulePath("layer1.0.conv1"));
  for (const char* bad : {"", "-a", ".a", "a.", "a..b", "a/b", "a b"})
    EXPECT_FALSE(onnx_io::IsModulePath(bad)) << bad;
}

TEST(ImportOnnx, TruncatedOrForeignFilesAreNamedErrors) {
  const std::string b = ReadBytes(Fixture("resnet_block.onnx"));
  ASSERT_GT(b.size(), 1000u);
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, b.size() / 3, b.size() / 2, b.size() - 1}) {
    try {
      ImportOnnx(b.data(), cut, "cut.onnx");
      ADD_FAILURE() << "a file cut to " << cut << " bytes imported";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cut.onnx"), std::string::npos) << e.what();
    }
  }
  const std::string text = "name: not an onnx file\n";
  EXPECT_THROW(
      {
        try {
          ImportOnnx(text.data(), text.size(), "x.onnx");
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("not an ONNX model"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
}

// A one-conv model with `extra` as its second node, built with ONNX's own classes.
std::string SmallModel(const std::function<void(onnx::GraphProto*)>& extra) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  onnx::GraphProto* g = m.mutable_graph();
  auto* in = g->add_input();
  in->set_name("x");
  auto* tt = in->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(1);
  for (int64_t d : {int64_t{-1}, int64_t{2}, int64_t{4}, int64_t{4}}) {
    if (d < 0) {
      tt->mutable_shape()->add_dim()->set_dim_param("N");
    } else {
      tt->mutable_shape()->add_dim()->set_dim_value(d);
    }
  }
  onnx::TensorProto* w = g->add_initializer();
  w->set_name("conv.weight");
  w->set_data_type(1);
  for (int64_t d : {3, 2, 3, 3}) w->add_dims(d);
  for (int i = 0; i < 54; ++i) w->add_float_data(0.01f * i);
  onnx::NodeProto* conv = g->add_node();
  conv->set_name("/conv/Conv");
  conv->set_op_type("Conv");
  conv->add_input("x");
  conv->add_input("conv.weight");
  conv->add_output("c");
  auto* pads = conv->add_attribute();
  pads->set_name("pads");
  pads->set_type(onnx::AttributeProto::INTS);
  for (int64_t p : {1, 1, 1, 1}) pads->add_ints(p);
  extra(g);
  g->add_output()->set_name("y");
  std::string bytes;
  m.SerializeToString(&bytes);
  return bytes;
}

std::string ImportError(const std::string& bytes) {
  try {
    ImportOnnx(bytes.data(), bytes.size(), "small.onnx");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ImportOnnx, AnOpWithoutALayerNamesTheNodeAndTheKnownOps) {
  const std::string e = ImportError(SmallModel([](onnx::GraphProto* g) {
    onnx::NodeProto* n = g->add_node();
    n->set_name("/act/Softplus");
    n->set_op_type("Softplus");
    n->add_input("c");
    n->add_output("y");
  }));
  EXPECT_NE(e.find("small.onnx: node '/act/Softplus' (Softplus)"), std::string::npos) << e;
  EXPECT_NE(e.find("BatchNormalization"), std::string::npos) << e;
  EXPECT_NE(e.find("Conv"), std::string::npos) << e;
}

TEST(ImportOnnx, AnAttributeWithoutACounterpartIsNamed) {
  const std::string e = ImportError(SmallModel([](onnx::GraphProto* g) {
    g->mutable_node(0)->mutable_attribute(0)->set_ints(3, 2);  // pads 1, 1 | 1, 2
    onnx::NodeProto* n = g->add_node();
    n->set_op_type("Relu");
    n->add_input("c");
    n->add_output("y");
  }));
  EXPECT_NE(e.find("node '/conv/Conv' (Conv)"), std::string::npos) << e;
  EXPECT_NE(e.find("pads"), std::string::npos) << e;
  const std::string e2 = ImportError(SmallModel([](onnx::GraphProto* g) {
    onnx::NodeProto* n = g->add_node();
    n->set_name("/pool/MaxPool");
    n->set_op_type("MaxPool");
    n->add_input("c");
    n->add_output("y");
    auto* k = n->add_attribute();
    k->set_name("kernel_shape");
    k->set_type(onnx::AttributeProto::INTS);
    k->add_ints(2);
    k->add_ints(2);
    auto* odd = n->add_attribute();
    odd->set_name("frobnicate");
    odd->set_type(onnx::AttributeProto::INT);
    odd->set_i(1);
  }));
  EXPECT_NE(e2.find("node '/pool/MaxPool' (MaxPool): attribute 'frobnicate'"), std::string::npos)
      << e2;
}

TEST(ImportOnnx, WriteImportedIsWholeOrNothing) {
  const fs::path dir = fs::temp_directory_path() / StrCat("cnnflow_import_", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path out = dir / "out";
  ImportedOnnx m = ImportFile(Fixture("resnet_block.onnx"));
  m.name = "resnet_block";
  // A config that does not load leaves nothing behind.
  EXPECT_THROW(WriteImported(m, "model: {", out.string()), Error);
  EXPECT_FALSE(fs::exists(out));
  // Whole: the config and the weights, which load as `cnnflow train` reads them.
  WriteImported(m, ImportedConfig(m, Fixture("resnet_block.onnx"), {}, {}), out.string());
  const RunConfig rc = LoadRunConfig((out / "model.yaml").string());
  EXPECT_EQ(rc.init_from.weights, (out / "model.safetensors").string());
  // Never over an existing folder's files.
  const ImportedOnnx g = ImportFile(Fixture("gelu_net.onnx"));
  EXPECT_THROW(WriteImported(g, ImportedConfig(g, Fixture("gelu_net.onnx"), {}, {}), out.string()),
               Error);
  EXPECT_EQ(LoadRunConfig((out / "model.yaml").string()).name, "resnet_block");
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cnnflow
