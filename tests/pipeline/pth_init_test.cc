// train.init and eval's weights from a .pth that torch.save wrote
// (tests/data/pth/pytorch_tiny.pth: tests/data/pytorch_tiny.safetensors, a
// DataParallel state_dict with "module." names and num_batches_tracked,
// saved by torch.save; tests/data/make_pth_fixtures.py): the model gets the
// very bytes the safetensors file gives it, which Training's tests show
// evaluate as PyTorch did.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "ops/io/weights_file.h"
#include "pipeline/trainer.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

std::map<std::string, Tensor> State(Trainer& t) {
  std::map<std::string, Tensor> out;
  for (auto& [name, tensor] : t.model().StateTensors()) out[name] = tensor.To(Device::Cpu());
  return out;
}

TEST(PthInit, TrainInitAndEvalWeightsReadAPthAsItsSafetensorsTwin) {
  const std::string config = "tests/data/pytorch_tiny.yaml";
  Trainer fresh(LoadRunConfig(config));
  Trainer from_st(
      LoadRunConfig(config, {"train.init={weights: tests/data/pytorch_tiny.safetensors}"}));
  Trainer from_pth(
      LoadRunConfig(config, {"train.init={weights: tests/data/pth/pytorch_tiny.pth}"}));
  Trainer evaluated(LoadRunConfig(config));
  evaluated.LoadWeights("tests/data/pth/pytorch_tiny.pth");  // cnnflow eval --weights
  const auto a = State(fresh), b = State(from_st), c = State(from_pth), d = State(evaluated);
  ASSERT_FALSE(b.empty());
  for (const auto& [name, t] : b) {
    EXPECT_TRUE(testing::SameBytes(c.at(name), t)) << name;
    EXPECT_TRUE(testing::SameBytes(d.at(name), t)) << name;
  }
  EXPECT_FALSE(testing::SameBytes(a.at("conv1.weight"), b.at("conv1.weight")));
  // The file itself, as the readers of weights see it.
  const SafetensorsFile f = LoadWeightsFile("tests/data/pth/pytorch_tiny.pth");
  EXPECT_EQ(f.metadata.at("format"), "pth");
  ASSERT_NE(f.Find("module.conv1.weight"), nullptr);
}

TEST(PthInit, AForbiddenPickleIsRefusedByTrainInitNamingTheGlobal) {
  const std::string error = testing::ErrorOf([] {
    Trainer t(LoadRunConfig("tests/data/pytorch_tiny.yaml",
                            {"train.init={weights: tests/data/pth/forbidden_system.pth}"}));
  });
  testing::ExpectContains(
      error, {"tests/data/pth/forbidden_system.pth", "GLOBAL 'posix.system' is not allowed"});
}

}  // namespace
}  // namespace cnnflow
