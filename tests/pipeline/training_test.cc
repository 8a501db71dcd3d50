// A short real training run on Fashion-MNIST through the YAML graph: the
// loss falls far below its start and accuracy is far above chance.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "ops/safetensors.h"
#include "pipeline/trainer.h"
#include "tests/test_dir.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

TEST(Training, FashionMnistSubsetLearns) {
  const std::string images = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
  ASSERT_TRUE(fs::exists(images)) << "Fashion-MNIST missing: run scripts/setup.sh "
                                     "(Debian package dataset-fashion-mnist)";
  // 200 steps of 64 = 12800 training images, then the whole test set.
  Trainer trainer(LoadRunConfig("configs/fashion_mnist.yaml",
                                {"train.epochs=1", "train.max_steps=200", "threads=2"}));
  const PassMetrics before = trainer.Evaluate();
  EXPECT_NEAR(before.mean_loss(), std::log(10.0), 0.3) << "an untrained model is near chance";

  const fs::path dir = testing::TestDir();
  const EpochReport r = trainer.Train(dir.string());
  EXPECT_EQ(r.train.batches, 200);
  EXPECT_LT(r.test.mean_loss(), 0.6 * before.mean_loss());
  EXPECT_GT(r.test.accuracy(), 0.70) << "chance is 0.10";
  EXPECT_EQ(r.test.samples, 10000);

  // The run folder: resolved config, one metrics row, weights named by layer.
  EXPECT_TRUE(fs::exists(dir / "config.yaml"));
  std::ifstream csv(dir / "metrics.csv");
  std::string header, row, extra;
  std::getline(csv, header);
  std::getline(csv, row);
  EXPECT_EQ(header.rfind("epoch,train_loss,train_accuracy,test_loss,test_accuracy", 0), 0u);
  EXPECT_EQ(row.rfind("1,", 0), 0u);
  EXPECT_FALSE(std::getline(csv, extra));
  SafetensorsFile weights = LoadSafetensors((dir / "model.safetensors").string());
  ASSERT_NE(weights.Find("conv1.weight"), nullptr);
  EXPECT_EQ(weights.Find("conv1.weight")->shape(), Shape({32, 1, 3, 3}));
  ASSERT_NE(weights.Find("fc2.bias"), nullptr);

  // Weights loaded into a fresh model give the same test accuracy.
  Trainer fresh(LoadRunConfig("configs/fashion_mnist.yaml", {"threads=2"}));
  fresh.LoadWeights((dir / "model.safetensors").string());
  EXPECT_DOUBLE_EQ(fresh.Evaluate().accuracy(), r.test.accuracy());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cnnflow
