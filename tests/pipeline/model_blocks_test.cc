// Blocks, expressions and the model library (pipeline/model_blocks.h): the
// names that come out are PyTorch's module paths, the library networks have
// torchvision's parameter counts, and every mistake is a ConfigError that
// says where.
#include "pipeline/model_blocks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "ops/cpu/elementwise.h"
#include "ops/model.h"
#include "ops/train/optimizer.h"
#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

ExpandedModel Expand(const std::string& text) {
  YamlDoc doc = YamlDoc::Parse(text, "cfg.yaml");
  return ExpandModel(doc, doc.root()["model"]);
}

std::string ErrorOf(const std::string& text) {
  try {
    Expand(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for\n" << text;
  return "";
}

const LayerSpec* Find(const ExpandedModel& m, const std::string& name) {
  for (const auto& s : m.layers)
    if (s.name == name) return &s;
  return nullptr;
}

std::vector<std::string> Names(const ExpandedModel& m) {
  std::vector<std::string> n;
  for (const auto& s : m.layers) n.push_back(s.name);
  return n;
}

// A template that uses blocks by hand: the example of docs/models.md, kept working.
constexpr const char* kBlocks = R"yaml(model:
  input: [3, 16, 16]
  blocks:
    basic:
      params: {planes: ~, stride: 1, downsample: false}
      layers:
        - {name: conv1, conv2d: {out: $planes, kernel: 3, stride: $stride, pad: 1, bias: false}}
        - {name: bn1, batchnorm: {}}
        - {name: relu1, relu: {}}
        - {name: conv2, conv2d: {out: $planes, kernel: 3, pad: 1, bias: false}}
        - {name: bn2, batchnorm: {}}
        - {name: downsample.0, conv2d: {out: $planes, kernel: 1, stride: $stride, bias: false},
           inputs: input, if: $downsample}
        - {name: downsample.1, batchnorm: {}, if: $downsample}
        - {name: add, add: {}, inputs: [bn2, "$downsample ? 'downsample.1' : 'input'"]}
        - {name: relu2, relu: {}}
  layers:
    - {name: conv1, conv2d: {out: 8, kernel: 3, pad: 1}}
    - {name: layer1, block: basic, repeat: 2, with: {planes: 8}}
    - {name: layer2, block: basic, repeat: 2, with: {planes: 16}, first: {stride: 2, downsample: true}}
    - {name: pool, global_avgpool: {}}
    - {name: fc, linear: {out: 10}}
)yaml";

TEST(ModelBlocks, InstancesGetModulePathsAndReadTheRightInputs) {
  const ExpandedModel m = Expand(kBlocks);
  const std::vector<std::string> n = Names(m);
  EXPECT_EQ(n.front(), "conv1");
  EXPECT_EQ(n.back(), "fc");
  // layer1: 2 x 7 layers (no downsample); layer2.0 has downsample, .1 not.
  EXPECT_EQ(n.size(), 1u + 14 + 9 + 7 + 2);
  for (const char* want : {"layer1.0.conv1", "layer1.1.bn2", "layer2.0.downsample.0",
                           "layer2.0.downsample.1", "layer2.1.relu2"}) {
    EXPECT_NE(std::find(n.begin(), n.end(), want), n.end()) << want;
  }
  EXPECT_EQ(Find(m, "layer2.1.downsample.0"), nullptr);
  // The shortcut of layer1.0 is the block's input: conv1's output.
  EXPECT_EQ(Find(m, "layer1.0.add")->inputs, (std::vector<std::string>{"layer1.0.bn2", "conv1"}));
  // layer1.1 reads layer1.0's output.
  EXPECT_EQ(Find(m, "layer1.1.add")->inputs,
            (std::vector<std::string>{"layer1.1.bn2", "layer1.0.relu2"}));
  EXPECT_EQ(Find(m, "layer2.0.downsample.0")->inputs, (std::vector<std::string>{"layer1.1.relu2"}));
  EXPECT_EQ(Find(m, "layer2.0.add")->inputs,
            (std::vector<std::string>{"layer2.0.bn2", "layer2.0.downsample.1"}));
  EXPECT_EQ(Find(m, "layer2.0.conv1")->args.Ints("stride", 2), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(Find(m, "layer2.1.conv1")->args.Ints("stride", 2), (std::vector<int64_t>{1, 1}));
  // And it builds: shapes check through the blocks.
  auto model = Model::Build(m.layers, m.input_shape);
  EXPECT_EQ(model->output_shape(), Shape({10}));
}

TEST(ModelBlocks, Expressions) {
  const ExpandedModel m = Expand(R"yaml(model:
  input: [3, 8, 8]
  blocks:
    b:
      params: {w: 6, widths: [4, 12], name: x, scale: 1.5}
      layers:
        - {name: a, conv2d: {out: "$w * 4 // 3 + $widths[1] - 2 * 2", kernel: 1}}
        - {name: b, conv2d: {out: "make_divisible($w * $scale, 8)", kernel: 1}}
        - {name: "'c.' + ($name == 'x' ? 1 : 0)", conv2d: {out: "max(3, min(5, round(2.5 + 0 * $w)))", kernel: 1}}
        - {name: d, conv2d: {out: "int(7 / 2) + ceil(0.2) + floor(-0.5) % 3 + 0 * $w", kernel: 1},
           if: "not ($w < 2) and ($w >= 6 or false)"}
        - {name: e, dropout: {p: "$scale / 3"}}
  layers:
    - {name: x, block: b}
)yaml");
  EXPECT_EQ(Find(m, "x.a")->args.Int("out"), 6 * 4 / 3 + 12 - 4);
  EXPECT_EQ(Find(m, "x.b")->args.Int("out"), 16);   // make_divisible(9, 8): 9 -> 8 < 0.9 * 9, so 16
  EXPECT_EQ(Find(m, "x.c.1")->args.Int("out"), 3);  // round(2.5) == 2 (ties to even) -> max(3, 2)
  EXPECT_EQ(Find(m, "x.d")->args.Int("out"), 3 + 1 + 2);  // floor(-0.5) % 3 == -1 % 3 == 2
  EXPECT_DOUBLE_EQ(Find(m, "x.e")->args.Float("p"), 0.5);
}

TEST(ModelBlocks, RepeatWithStartIndexAndTemplatedNames) {
  const ExpandedModel m = Expand(R"yaml(model:
  input: [2, 8]
  blocks:
    unit:
      params: {c: ~, i: 0}
      layers:
        - {name: conv, conv1d: {out: "$c + $i", kernel: 1}}
  layers:
    - {name: features, block: unit, repeat: 2, start: 3, with: {c: 4, i: $index}}
    - {name: "'dense' + $index", block: unit, repeat: 2, start: 1, with: {c: 1}}
)yaml");
  EXPECT_EQ(Names(m), (std::vector<std::string>{"features.3.conv", "features.4.conv", "dense1.conv",
                                                "dense2.conv"}));
  EXPECT_EQ(Find(m, "features.4.conv")->args.Int("out"), 8);
}

TEST(ModelBlocks, ErrorsSayWhereAndWhat) {
  const std::string base = R"yaml(model:
  input: [3, 8, 8]
  blocks:
    b:
      params: {planes: ~}
      layers:
        - {name: conv, conv2d: {out: $planes, kernel: 1}}
  layers:
)yaml";
  std::string e = ErrorOf(base + "    - {name: x, block: bb, with: {planes: 2}}\n");
  EXPECT_NE(e.find("cfg.yaml:9:"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown block 'bb'; known: b, "), std::string::npos) << e;
  e = ErrorOf(base + "    - {name: x, block: b, with: {plane: 2}}\n");
  EXPECT_NE(e.find("unknown param of block 'b' 'plane' (did you mean 'planes'?)"),
            std::string::npos)
      << e;
  e = ErrorOf(base + "    - {name: x, block: b}\n");
  EXPECT_NE(e.find("needs param 'planes'"), std::string::npos) << e;
  e = ErrorOf(base + "    - {name: x, block: b, with: {planes: \"$planes * 2\"}}\n");
  EXPECT_NE(e.find("unknown param 'planes'"), std::string::npos) << e;
  e = ErrorOf(base + "    - {name: x, block: b, with: {planes: \"$index +\"}}\n");
  EXPECT_NE(e.find("in \"$index +\""), std::string::npos) << e;
  e = ErrorOf(R"yaml(model:
  input: [3, 8, 8]
  blocks:
    b:
      layers:
        - {name: conv, conv2d: {out: 2, kernel: 1}, inputs: stem}
  layers:
    - {name: stem, conv2d: {out: 2, kernel: 1}}
    - {name: x, block: b}
)yaml");
  EXPECT_NE(e.find("reads 'stem', which is neither 'input' nor an earlier layer of the block"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("cfg.yaml:6:"), std::string::npos) << e;
  e = ErrorOf("model: {library: resnet05}\n");
  EXPECT_NE(e.find("unknown library model 'resnet05' (did you mean 'resnet50'?)"),
            std::string::npos)
      << e;
  e = ErrorOf("model: {library: resnet18, with: {clases: 10}}\n");
  EXPECT_NE(e.find("'clases' (did you mean 'classes'?)"), std::string::npos) << e;
  e = ErrorOf(R"yaml(model:
  input: [3, 8, 8]
  layers:
    - {name: conv, conv2d: {out: 2, kernel: 1}, init: {weight: zero}}
)yaml");
  EXPECT_NE(e.find("unknown init scheme 'zero' (did you mean 'zeros'?)"), std::string::npos) << e;
}

TEST(ModelBlocks, AConfigsBlockShadowsTheLibrarysForThatConfigOnly) {
  const ExpandedModel m = Expand(R"yaml(model:
  input: [3, 8, 8]
  blocks:
    conv_bn_act:
      params: {out: ~}
      layers:
        - {name: conv, conv2d: {out: $out, kernel: 1}}
  layers:
    - {name: stem, block: conv_bn_act, with: {out: 4}}
)yaml");
  EXPECT_EQ(Names(m), std::vector<std::string>{"stem.conv"});
  // The library's conv_bn_act is untouched.
  const ExpandedModel lib = ExpandLibraryModel("mobilenet_v2");
  EXPECT_NE(Find(lib, "features.0.1"), nullptr);
  EXPECT_EQ(Model::Build(lib.layers, lib.input_shape)->NumParameters(), 3504872);
}

// torchvision's parameter counts (sum(p.numel() for p in model.parameters())
// of torchvision 0.2x), and a few of its state_dict names.
TEST(ModelLibrary, TorchvisionParameterCountsAndNames) {
  const std::map<std::string, int64_t> counts = {
      {"resnet18", 11689512},      {"resnet34", 21797672},          {"resnet50", 25557032},
      {"resnet101", 44549160},     {"resnext50_32x4d", 25028904},   {"vgg11_bn", 132868840},
      {"mobilenet_v2", 3504872},   {"mobilenet_v3_small", 2542856}, {"efficientnet_b0", 5288548},
      {"convnext_tiny", 28589128}, {"densenet121", 7978856},
  };
  std::set<std::string> listed;
  for (const LibraryModel& lm : LibraryModels()) listed.insert(lm.name);
  for (const auto& [name, count] : counts) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(listed.count(name));
    const ExpandedModel m = ExpandLibraryModel(name);
    auto model = Model::Build(m.layers, m.input_shape);
    EXPECT_EQ(model->NumParameters(), count);
    EXPECT_EQ(model->output_shape(), Shape({1000}));
  }
  const ExpandedModel r50 = ExpandLibraryModel("resnet50", {"classes=10", "in_channels=1"});
  auto model = Model::Build(r50.layers, r50.input_shape);
  EXPECT_EQ(model->output_shape(), Shape({10}));
  EXPECT_EQ(r50.input_shape, Shape({1, 224, 224}));
  std::set<std::string> names;
  for (const auto& [n, t] : model->StateTensors()) names.insert(n);
  for (const char* want : {"conv1.weight", "bn1.running_var", "layer1.0.downsample.0.weight",
                           "layer3.5.bn3.bias", "layer4.2.conv3.weight", "fc.bias"}) {
    EXPECT_TRUE(names.count(want)) << want;
  }
  EXPECT_EQ(names.size(), 267u);  // torchvision resnet50's state_dict, num_batches_tracked left out
}

TEST(ModelLibrary, EveryModelBuildsWithItsDefaults) {
  for (const LibraryModel& lm : LibraryModels()) {
    SCOPED_TRACE(lm.name);
    const ExpandedModel m = ExpandLibraryModel(lm.name);
    EXPECT_GE(m.input_shape.rank(), 2);
    EXPECT_NO_THROW(Model::Build(m.layers, m.input_shape));
    EXPECT_FALSE(lm.doc.empty());
  }
}

TEST(LayerTensorSpecs, FrozenTensorsAreNotUpdatedAndNamedInitsApply) {
  const ExpandedModel m = Expand(R"yaml(model:
  input: [2, 5, 5]
  layers:
    - {name: conv, conv2d: {out: 4, kernel: 3, pad: 1, groups: 2}, init: {weight: dirac, bias: ones}}
    - {name: bn, batchnorm: {}, trainable: {weight: false}, init: {weight: zeros}}
    - {name: fc, linear: {out: 3}, trainable: false}
)yaml");
  auto model = Model::Build(m.layers, m.input_shape);
  // dirac (nn.init.dirac_, groups 2): output channel d of each group copies
  // input channel d of the group at the centre; with 1 input channel per
  // group, output channels 0 and 2.
  const Tensor& w = model->layer(0).parameters()[0].value;  // [4, 1, 3, 3]
  for (int64_t k = 0; k < 4; ++k)
    for (int64_t t = 0; t < 9; ++t)
      EXPECT_EQ(w.At(k * 9 + t), t == 4 && k % 2 == 0 ? 1.0 : 0.0) << k << " " << t;
  EXPECT_EQ(model->layer(0).parameters()[1].value.At(3), 1.0);  // bias: ones
  const Tensor x = testing::RandomTensor({2, 2, 5, 5}, 3, -1, 1, DType::kF32);
  ForwardContext ctx;
  model->Forward(x, ctx);
  // bn.weight is zero, so the output is the bias: nothing flows to fc's input but a constant.
  model->Backward(testing::RandomTensor({2, 3}, 4, -1, 1, DType::kF32));
  auto params = model->NamedParameters();
  std::map<std::string, Tensor> before;
  for (auto& p : params) before[p.name] = p.param->value.Clone();
  Args sgd;
  sgd.Set("lr", 0.5);
  sgd.Set("weight_decay", 0.1);
  sgd.FillDefaults(OptimizerSchema("sgd"));
  auto opt = MakeOptimizer("sgd", sgd, params);
  opt->Step(0.5);
  for (auto& p : params) {
    const bool frozen = p.name == "bn.weight" || p.name.rfind("fc.", 0) == 0;
    EXPECT_EQ(p.param->trainable, !frozen) << p.name;
    const double moved = MaxAbsDiff(before[p.name], p.param->value);
    if (frozen)
      EXPECT_EQ(moved, 0.0) << p.name;
    else
      EXPECT_GT(moved, 0.0) << p.name;
  }
  EXPECT_EQ(model->layer(1).parameters()[0].value.At(0), 0.0);
}

// dirac_first (nn.init.dirac_(w[:C])): the first C filters pass channel d
// through at the centre; the later ones keep the default init, bitwise.
TEST(LayerTensorSpecs, DiracFirstSetsTheFirstFiltersOnly) {
  const char* text = R"yaml(model:
  input: [2, 5, 5]
  layers:
    - {name: conv, conv2d: {out: 5, kernel: 3, pad: 1, bias: false}INIT}
)yaml";
  auto build = [&](const std::string& init) {
    std::string t = text;
    t.replace(t.find("INIT"), 4, init);
    const ExpandedModel m = Expand(t);
    return Model::Build(m.layers, m.input_shape, {.seed = 7});
  };
  auto plain = build("");
  auto first = build(", init: {weight: dirac_first}");
  const Tensor& p = plain->layer(0).parameters()[0].value;  // [5, 2, 3, 3]
  const Tensor& w = first->layer(0).parameters()[0].value;
  for (int64_t k = 0; k < 5; ++k)
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t t = 0; t < 9; ++t) {
        const int64_t i = (k * 2 + c) * 9 + t;
        if (k < 2) {
          EXPECT_EQ(w.At(i), k == c && t == 4 ? 1.0 : 0.0) << k << " " << c << " " << t;
        } else {
          EXPECT_EQ(w.At(i), p.At(i)) << "filter " << k << " keeps its init";
        }
      }
}

}  // namespace
}  // namespace cnnflow
