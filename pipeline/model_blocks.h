// The model section of a config -> the flat list of layers Model::Build
// takes. Three ways to write a network, which mix:
//
//   layers: a list of {name: x, <type>: {params}, inputs: [...]}, as always;
//   blocks: a parameterised group of layers, defined once and used many
//     times under a name prefix, so the layers come out with PyTorch's
//     module paths as names (torchvision's _make_layer):
//
//       model:
//         blocks:
//           basic:                                 # params: their defaults (~: required)
//             params: {planes: ~, stride: 1, downsample: false}
//             layers:
//               - {name: conv1, conv2d: {out: $planes, kernel: 3, stride: $stride, pad: 1, bias:
//               false}}
//               - {name: bn1, batchnorm: {}}
//               - {name: relu1, relu: {}}
//               - {name: conv2, conv2d: {out: $planes, kernel: 3, pad: 1, bias: false}}
//               - {name: bn2, batchnorm: {}}
//               - {name: downsample.0, conv2d: {out: $planes, kernel: 1, stride: $stride, bias:
//               false},
//                  inputs: input, if: $downsample}
//               - {name: downsample.1, batchnorm: {}, if: $downsample}
//               - {name: add, add: {}, inputs: [bn2, "$downsample ? 'downsample.1' : 'input'"]}
//               - {name: relu2, relu: {}}
//         layers:
//           - ...
//           - {name: layer2, block: basic, repeat: 2, with: {planes: 128},
//              first: {stride: 2, downsample: true}}   # layer2.0.conv1 ... layer2.1.relu2
//
//     Inside a block, `input` is the block's input and other names are the
//     block's own layers. `repeat: N` makes instances NAME.0 .. NAME.N-1
//     (`start: S`: NAME.S ..), each reading the one before; `first:`
//     overrides params of the first. `$index` is the instance's number in
//     `with`, `first` and a templated name (`name: "'denselayer' + $index"`
//     names the instances themselves). Without `repeat` the instance is NAME.
//   library: a named network of the model library (models/*.yaml, built
//     into the binary): `model: {library: resnet50, with: {classes: 10}}`.
//     Its blocks can also be used by name in any config.
//
// Any scalar that contains `$` is an expression over the params in scope:
// `$planes`, `$planes * 4`, `$depths[1]`, `$w // 8`, `$a == 'x'`,
// `$c ? 'x' : 'y'`, `not $b`, `$a and $b`, `'conv.' + $i`, and the functions
// int, round, ceil, floor, min, max, make_divisible(v, d) (torchvision's;
// the grammar: pipeline/block_expression.h);
// a value that is a bare `$name` keeps its type (a list stays a list). A
// layer's type may be a param (`$act: {}`). A layer or block with
// `if: EXPR` false is left out.
//
// Per layer, besides its type: `trainable: false` (every tensor frozen) or
// `{weight: false}` (one tensor), and `init: {weight: zeros}` (zeros, ones,
// dirac, kaiming_normal_fan_out; `default` keeps the layer's own).
#pragma once

#include <string>
#include <vector>

#include "ops/model.h"
#include "pipeline/yaml_util.h"

namespace cnnflow {

struct ExpandedModel {
  std::vector<LayerSpec> layers;
  Shape input_shape;  // empty when neither the section nor the library gave one
};

// The model section `model` of `doc` (its `library`, `with`, `blocks`,
// `layers` and `input` keys) expanded. Every error names the file, line
// and column (of the config, or of the library file), the layer and the
// block instance it came from.
ExpandedModel ExpandModel(const YamlDoc& doc, const YAML::Node& model);

// One layer as a line of model.layers: "- {name: n, type: {args}, inputs: [...]}"
// (names that YAML would not read back as the same string are quoted).
std::string LayerSpecLine(const LayerSpec& s);

// The model library: every named network with its options (param
// defaults) and documentation, in file order.
struct LibraryModel {
  std::string name;
  std::string file;  // "models/resnet.yaml"
  std::string doc;
  std::vector<std::pair<std::string, std::string>> options;  // name, default as YAML
};
std::vector<LibraryModel> LibraryModels();
// The library network `name` with `overrides` ("classes=10"; "input=[3,
// 32, 32]" sets the sample shape) applied, as a config's model section
// would give it.
ExpandedModel ExpandLibraryModel(const std::string& name,
                                 const std::vector<std::string>& overrides = {});

}  // namespace cnnflow
