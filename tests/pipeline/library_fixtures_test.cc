// Library networks against PyTorch without PyTorch: tests/data/library/ holds
// small versions of a ResNet, a MobileNetV2, an EfficientNet, a ConvNeXt and
// InceptionTime with PyTorch's weights, an input and PyTorch's logits
// (tests/data/make_library_fixtures.py writes them). Each loads strictly into
// the library network of the same options, and gives PyTorch's logits in
// evaluation and in training mode. bench/library_vs_pytorch.py checks the
// full-size networks and their gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>

#include "ops/io/safetensors.h"
#include "ops/model.h"
#include "pipeline/model_blocks.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

std::string FixtureDir() {
  const char* src = std::getenv("CNNFLOW_SOURCE_DIR");
  return (fs::path(src != nullptr ? src : ".") / "tests" / "data" / "library").string();
}

// ||a - b|| / ||b||
double RelativeError(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double d = 0, n = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    d += (a.At(i) - b.At(i)) * (a.At(i) - b.At(i));
    n += b.At(i) * b.At(i);
  }
  return std::sqrt(d / std::max(n, 1e-30));
}

class LibraryFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(LibraryFixture, MatchesPyTorch) {
  const std::string path = (fs::path(FixtureDir()) / (GetParam() + ".safetensors")).string();
  const SafetensorsFile f = LoadSafetensors(path);
  std::vector<std::string> options;
  std::stringstream ss(f.metadata.at("with"));
  for (std::string o; std::getline(ss, o, ';');) options.push_back(o);
  const ExpandedModel m = ExpandLibraryModel(f.metadata.at("model"), options);
  auto model = Model::Build(m.layers, m.input_shape);

  // Strict: every tensor of the model from the file, every weight of the file used.
  const std::set<std::string> data = {"input", "logits", "logits_train"};
  std::vector<std::pair<std::string, Tensor>> weights;
  for (const auto& [name, t] : f.tensors)
    if (!data.count(name)) weights.emplace_back(name, t);
  EXPECT_EQ(weights.size(), model->StateTensors().size());
  CopyNamedTensors(weights, model->StateTensors(), path);

  const Tensor x = f.Find("input")->Cast(DType::kF32);
  ForwardContext eval;
  eval.training = false;
  EXPECT_LE(RelativeError(model->Forward(x, eval), *f.Find("logits")), 1e-4);
  ForwardContext train;
  EXPECT_LE(RelativeError(model->Forward(x, train), *f.Find("logits_train")), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Library, LibraryFixture,
                         ::testing::Values("resnet_bottleneck", "mobilenet_v2", "efficientnet",
                                           "convnext", "inception_time"));

}  // namespace
}  // namespace cnnflow
