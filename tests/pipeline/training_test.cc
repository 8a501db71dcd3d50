// A short real training run on Fashion-MNIST through the YAML graph: the
// loss falls far below its start and accuracy is far above chance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ops/device.h"
#include "ops/io/safetensors.h"
#include "pipeline/trainer.h"
#include "tests/testing/helpers.h"
#include "tests/testing/test_dir.h"

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

// train.init from weights PyTorch trained and wrote (a DataParallel
// state_dict by the safetensors package: "module." names, BN's
// num_batches_tracked; tests/data/make_pytorch_tiny.py): before any step
// cnnflow evaluates them as PyTorch did.
TEST(Training, InitFromPyTorchWeightsEvaluatesAsPyTorchDid) {
  std::ifstream json("tests/data/pytorch_tiny.json");
  std::stringstream text;
  text << json.rdbuf();
  const std::string j = text.str();
  auto number = [&](const std::string& key) {
    const size_t at = j.find("\"" + key + "\":");
    EXPECT_NE(at, std::string::npos) << key;
    return std::stod(j.substr(at + key.size() + 3));
  };
  Trainer trainer(LoadRunConfig("tests/data/pytorch_tiny.yaml",
                                {"train.init={weights: tests/data/pytorch_tiny.safetensors}"}));
  const PassMetrics m = trainer.Evaluate();
  EXPECT_EQ(m.samples, static_cast<int64_t>(number("test_samples")));
  std::printf("cnnflow: %lld correct, loss %.6f; PyTorch: %.0f correct, loss %.6f\n",
              static_cast<long long>(m.correct), m.mean_loss(), number("test_correct"),
              number("test_loss"));
  // Argmax ties and the last bits of the sums may move a sample or two.
  EXPECT_NEAR(static_cast<double>(m.correct), number("test_correct"), 2);
  EXPECT_NEAR(m.mean_loss(), number("test_loss"), 1e-4);
}

TEST(Training, InitIsStrictUnlessToldAndSkipLeavesTheFreshInitialisation) {
  // A new head of 12 outputs: strict refuses, naming the tensor and both shapes.
  const fs::path dir = testing::TestDir();
  const std::string twelve = (dir / "twelve.yaml").string();
  {
    std::ifstream in("tests/data/pytorch_tiny.yaml");
    std::stringstream yaml;
    yaml << in.rdbuf();
    std::string text = yaml.str();
    const size_t at = text.find("linear: {out: 10}");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, 17, "linear: {out: 12}");
    std::ofstream(twelve) << text;
  }
  const std::string weights = "train.init={weights: tests/data/pytorch_tiny.safetensors}";
  const std::string error =
      testing::ErrorOf<ConfigError>([&] { Trainer t(LoadRunConfig(twelve, {weights})); });
  testing::ExpectContains(error, {"tests/data/pytorch_tiny.safetensors does not fit the model",
                                  "'fc.weight' is [10, 784] in the file, [12, 784] in the model",
                                  "'fc.bias' is [10] in the file, [12] in the model"});
  // skip: [fc.*] keeps the fresh head and loads the rest.
  Trainer fresh(LoadRunConfig(twelve));
  Trainer tuned(LoadRunConfig(
      twelve, {"train.init={weights: tests/data/pytorch_tiny.safetensors, skip: [fc.*]}"}));
  const SafetensorsFile file = LoadSafetensors("tests/data/pytorch_tiny.safetensors");
  std::map<std::string, Tensor> a, b;
  for (auto& [n, t] : fresh.model().StateTensors()) a[n] = t;
  for (auto& [n, t] : tuned.model().StateTensors()) b[n] = t;
  auto same = [](const Tensor& x, const Tensor& y) {
    return x.shape() == y.shape() && std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
  };
  EXPECT_TRUE(same(a.at("fc.weight"), b.at("fc.weight")));
  EXPECT_TRUE(same(b.at("conv1.weight"), *file.Find("module.conv1.weight")));
  EXPECT_TRUE(same(b.at("bn1.running_var"), *file.Find("module.bn1.running_var")));
  EXPECT_FALSE(same(a.at("conv1.weight"), b.at("conv1.weight")));
  // strict: false loads what fits and leaves the rest as skip would.
  Trainer loose(LoadRunConfig(
      twelve, {"train.init={weights: tests/data/pytorch_tiny.safetensors, strict: false}"}));
  std::map<std::string, Tensor> c;
  for (auto& [n, t] : loose.model().StateTensors()) c[n] = t;
  EXPECT_TRUE(same(c.at("fc.weight"), a.at("fc.weight")));
  EXPECT_TRUE(same(c.at("conv1.weight"), b.at("conv1.weight")));
  fs::remove_all(dir);
}

// train.max_steps cuts training, not evaluation (its accuracy is of the
// whole test set unless train.eval_max_steps cuts that too).
TEST(Training, MaxStepsLeavesEvaluationWhole) {
  const std::vector<std::string> quick = {"train.epochs=1", "train.max_steps=2", "threads=2"};
  Trainer whole(LoadRunConfig("configs/fashion_mnist.yaml", quick));
  const fs::path dir = testing::TestDir();
  EpochReport r = whole.Train((dir / "whole").string());
  EXPECT_EQ(r.train.batches, 2);
  EXPECT_EQ(r.test.samples, 10000);
  std::vector<std::string> cut = quick;
  cut.push_back("train.eval_max_steps=3");
  Trainer part(LoadRunConfig("configs/fashion_mnist.yaml", cut));
  r = part.Train((dir / "part").string());
  EXPECT_EQ(r.test.samples, 3000);  // 3 batches of train.eval_batch
  EXPECT_EQ(part.Evaluate().samples, 10000) << "cnnflow eval covers the whole set";
  fs::remove_all(dir);
}

// schedule: {decay: piecewise}: milestones in epochs (fractions allowed), as
// the trainer turns them into steps.
TEST(Training, PiecewiseScheduleMilestonesAreEpochs) {
  Trainer t(LoadRunConfig(
      "configs/fashion_mnist.yaml",
      {"train.epochs=2", "train.max_steps=10", "threads=2",
       "train.schedule={decay: piecewise, milestones: [0, 0.5, 2], factors: [0, 1, 0]}"}));
  ASSERT_EQ(t.steps_per_epoch(), 10);
  const double lr = t.config().optimizer.args.Float("lr");
  const LrSchedule& s = *t.context().schedule;
  EXPECT_DOUBLE_EQ(s.At(0), 0.0);
  EXPECT_DOUBLE_EQ(s.At(5), lr);  // epoch 0.5
  EXPECT_DOUBLE_EQ(s.At(10), lr * (1.0 - 5.0 / 15.0));
  EXPECT_DOUBLE_EQ(s.At(20), 0.0);
  testing::ExpectContains(
      testing::ErrorOf<ConfigError>([] {
        Trainer bad(LoadRunConfig(
            "configs/fashion_mnist.yaml",
            {"threads=2", "train.schedule={decay: piecewise, milestones: [0, 1], factors: [1]}"}));
      }),
      {"fashion_mnist.yaml: train.schedule: decay: piecewise needs as many milestones as factors"});
}

// The rows of a run's metrics.csv (its header left out), split at commas.
std::vector<std::vector<std::string>> MetricsRows(const fs::path& dir) {
  std::ifstream csv(dir / "metrics.csv");
  std::string row;
  std::getline(csv, row);
  std::vector<std::vector<std::string>> rows;
  while (std::getline(csv, row)) {
    std::stringstream fields(row);
    rows.emplace_back();
    for (std::string x; std::getline(fields, x, ',');) rows.back().push_back(x);
  }
  return rows;
}

// A run without a test set says so: its metrics rows leave the test
// columns empty, not a loss and an accuracy of 0.
TEST(Training, ARunWithoutATestSetLeavesTheTestColumnsEmpty) {
  Trainer trainer(
      LoadRunConfig("configs/fashion_mnist.yaml",
                    {"train.epochs=2", "train.max_steps=10", "threads=2", "data.test=null"}));
  const fs::path dir = testing::TestDir();
  const EpochReport r = trainer.Train(dir.string());
  EXPECT_EQ(r.test.samples, 0);
  const std::vector<std::vector<std::string>> rows = MetricsRows(dir);
  for (const auto& f : rows) {
    ASSERT_GE(f.size(), 5u);
    EXPECT_EQ(f[3], "");
    EXPECT_EQ(f[4], "");
    EXPECT_NE(f[2], "");
  }
  EXPECT_GE(rows.size(), 1u);
  fs::remove_all(dir);
}

// Evaluation's batches of train.eval_batch = 1000 go through the model
// train.batch = 64 rows at a time (graphs/data_parallel.yaml), freeing
// activations as each forward goes: the same results as batches of 64, in
// far less than a forward of 1000 rows, whose conv1 output [1000, 32, 28, 28]
// alone is 100 MB.
TEST(Training, EvaluationRunsInMicroBatchesOfTheTrainingBatch) {
  Trainer reference(
      LoadRunConfig("configs/fashion_mnist.yaml", {"threads=2", "train.eval_batch=64"}));
  const PassMetrics ref = reference.Evaluate();
  EXPECT_EQ(ref.batches, 157);

  Trainer trainer(LoadRunConfig("configs/fashion_mnist.yaml", {"threads=2"}));
  MemoryPool& pool = PoolFor(Device::Cpu());
  const size_t before = pool.bytes_in_use();
  pool.ResetPeak();
  const PassMetrics m = trainer.Evaluate();
  const size_t peak = pool.peak_bytes_in_use() - before;
  EXPECT_EQ(m.batches, 10);
  EXPECT_EQ(m.samples, 10000);
  EXPECT_EQ(m.correct, ref.correct);
  EXPECT_NEAR(m.mean_loss(), ref.mean_loss(), 1e-6);
  EXPECT_LT(peak, size_t{40} << 20) << "bytes above what was in use before the pass";
}

// Autotuning moves the loader's knobs while training, logs each move, and
// changes nothing in what is learned: samples, order and augmentation do
// not depend on how many decode tasks or prefetched batches there are.
TEST(Training, AutotuneLogsItsMovesAndLeavesTheResultBitwiseUnchanged) {
  const std::vector<std::string> common = {"train.epochs=1", "train.max_steps=200", "threads=2"};
  auto with = [&](const std::string& autotune) {
    std::vector<std::string> o = common;
    o.push_back("graph.autotune=" + autotune);
    return o;
  };
  const fs::path dir = testing::TestDir();
  Trainer tuned(LoadRunConfig("configs/fashion_mnist.yaml", with("true")));
  tuned.Train((dir / "tuned").string());
  Trainer plain(LoadRunConfig("configs/fashion_mnist.yaml", with("false")));
  plain.Train((dir / "plain").string());
  EXPECT_FALSE(fs::exists(dir / "plain" / "autotune.csv"));

  std::ifstream log(dir / "tuned" / "autotune.csv");
  std::string line;
  std::getline(log, line);
  EXPECT_EQ(line, "batch,action,knob,from,to,images_per_s_before,images_per_s_after,reason");
  int tries = 0;
  while (std::getline(log, line)) {
    if (line.find(",try,") == std::string::npos) continue;
    ++tries;
    const bool threads = line.find(",load.threads,") != std::string::npos;
    EXPECT_TRUE(threads || line.find(",prefetch.depth,") != std::string::npos) << line;
    // load.threads stays within the run's 2 threads.
    if (threads) {
      EXPECT_TRUE(line.find(",1,2,") != std::string::npos ||
                  line.find(",2,1,") != std::string::npos)
          << line;
    }
  }
  EXPECT_GE(tries, 1) << "200 batches leave time for a baseline and one move";

  const auto a = tuned.model().StateTensors(), b = plain.model().StateTensors();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& [name, t] = a[i];
    const Tensor& u = b[i].second;
    ASSERT_EQ(std::memcmp(t.data<float>(), u.data<float>(), t.numel() * sizeof(float)), 0) << name;
  }
  fs::remove_all(dir);
}

// train.epochs: 1.5 trains one epoch and the first half of the next (in
// optimizer steps), and the schedule ends with it.
TEST(Training, AFractionalEpochCountEndsTheLastPassEarly) {
  Trainer t(LoadRunConfig(
      "configs/fashion_mnist.yaml",
      {"train.epochs=1.5", "train.max_steps=10", "train.eval_max_steps=1", "threads=2",
       "train.schedule={decay: piecewise, milestones: [0, 1.5], "
       "factors: [1, 0]}"}));
  ASSERT_EQ(t.steps_per_epoch(), 10);
  const fs::path dir = testing::TestDir();
  const EpochReport r = t.Train(dir.string());
  EXPECT_EQ(r.epoch, 2);
  EXPECT_EQ(r.train.batches, 5);
  EXPECT_EQ(t.global_step(), 15);
  EXPECT_EQ(t.context().schedule->At(15), 0.0);  // the schedule's end is the run's
  EXPECT_GT(t.context().schedule->At(14), 0.0);
  fs::remove_all(dir);
}

// A group with lr_scale 0 holds its tensors where they started while the
// rest train: the trainer hands the groups to every replica's optimizer.
TEST(Training, AParamGroupWithLrScaleZeroHoldsItsTensors) {
  Trainer t(LoadRunConfig(
      "configs/fashion_mnist.yaml",
      {"train.epochs=1", "train.max_steps=5", "train.eval_max_steps=1", "threads=2",
       "graph.devices=[cpu:0, cpu:1]", "train.param_groups=[{params: [fc2.*], lr_scale: 0}]"}));
  std::map<std::string, Tensor> before;
  for (auto& [name, value] : t.model().StateTensors()) before[name] = value.Clone();
  const fs::path dir = testing::TestDir();
  t.Train(dir.string());
  for (int r = 0; r < 2; ++r) {
    for (auto& [name, value] : t.replicas().model(r).StateTensors()) {
      if (name.find("running") != std::string::npos ||
          name.find("num_batches") != std::string::npos)
        continue;
      const bool held = name.rfind("fc2.", 0) == 0;
      double moved = 0;
      for (int64_t i = 0; i < value.numel(); ++i)
        moved = std::max(moved, std::abs(value.At(i) - before[name].At(i)));
      if (held) {
        EXPECT_EQ(moved, 0.0) << name << " of replica " << r;
      } else {
        EXPECT_GT(moved, 0.0) << name << " of replica " << r;
      }
    }
  }
  fs::remove_all(dir);
}

// graph.flush_denormals: the run's kernels treat denormal floats as zero. A
// model that scales its input down into the denormals (~1e-40) and back up
// feeds its linear layer zeros where they are flushed, so the layer's
// weights never move; with IEEE's gradual underflow they train. On one
// replica (the trainer's arena) and on two (an arena each).
TEST(Training, FlushDenormalsZeroesWhatUnderflows) {
  const std::string layers =
      "model.layers=[{name: flatten, flatten: {}}, {name: down1, mul: {scale: 1.0e-20}}, "
      "{name: down2, mul: {scale: 1.0e-20}}, {name: up1, mul: {scale: 1.0e+20}}, "
      "{name: up2, mul: {scale: 1.0e+20}}, {name: fc, linear: {out: 10}}]";
  for (const char* devices : {"graph.devices=[cpu:0]", "graph.devices=[cpu:0, cpu:1]"}) {
    for (const bool flush : {true, false}) {
      SCOPED_TRACE(StrCat(devices, " flush_denormals ", flush));
      Trainer t(LoadRunConfig(
          "configs/fashion_mnist.yaml",
          {"train.epochs=1", "train.max_steps=2", "train.eval_max_steps=1", "threads=2", devices,
           layers, StrCat("graph.flush_denormals=", flush ? "true" : "false")}));
      auto fc_weight = [&] {
        for (auto& [name, value] : t.model().StateTensors())
          if (name == "fc.weight") return value.Clone();
        ADD_FAILURE() << "no fc.weight";
        return Tensor();
      };
      const Tensor before = fc_weight();
      const fs::path dir = testing::TestDir();
      t.Train(dir.string());
      const Tensor after = fc_weight();
      double moved = 0;
      for (int64_t i = 0; i < after.numel(); ++i)
        moved = std::max(moved, std::abs(after.At(i) - before.At(i)));
      if (flush) {
        EXPECT_EQ(moved, 0.0) << "the linear layer read denormals, not zeros";
      } else {
        EXPECT_GT(moved, 0.0) << "the denormals were flushed";
      }
    }
  }
}

// init: {weight: whiten} on the first conv: 18 filters for its 3x3 patches
// of one channel, the last 9 the first 9 negated, none left at the default
// init; a conv that does not read the image, or another filter count, is
// an error naming the layer.
TEST(Training, AWhiteningInitFillsTheFirstConvFromTheTrainingPatches) {
  const std::vector<std::string> sets = {"threads=2", "model.layers.0.conv2d.out=18",
                                         "model.layers.0.init={weight: whiten}"};
  Trainer t(LoadRunConfig("configs/fashion_mnist.yaml", sets));
  const Tensor& w = t.model().FindLayer("conv1")->parameters()[0].value;
  ASSERT_EQ(w.shape(), (Shape{18, 1, 3, 3}));
  for (int64_t f = 0; f < 9; ++f) {
    double norm = 0;
    for (int64_t k = 0; k < 9; ++k) {
      EXPECT_EQ(w.At((9 + f) * 9 + k), -w.At(f * 9 + k));
      norm += w.At(f * 9 + k) * w.At(f * 9 + k);
    }
    // A unit eigenvector over sqrt(lambda + eps): the norm grows as lambda falls.
    EXPECT_GT(norm, 0.1) << "filter " << f;
  }
  testing::ExpectContains(
      testing::ErrorOf<ConfigError>([] {
        Trainer bad(LoadRunConfig("configs/fashion_mnist.yaml",
                                  {"threads=2", "model.layers.0.init={weight: whiten}"}));
      }),
      {"fashion_mnist.yaml: layer 'conv1' init whiten: a 3x3 conv over 1 channels whitens 9 patch "
       "values: it needs 9 or 18 output channels",
       "not 32"});
  testing::ExpectContains(
      testing::ErrorOf<ConfigError>([] {
        Trainer bad(LoadRunConfig("configs/fashion_mnist.yaml",
                                  {"threads=2", "model.layers.3.init={weight: whiten}"}));
      }),
      {"layer 'conv2' init whiten: needs the weight of a conv2d that reads the model's image"});
}

// A group with until_epoch trains its tensors for the first steps only:
// fc2 moves in epoch 1 and holds in epoch 2, while the rest go on.
TEST(Training, AParamGroupUntilAnEpochHoldsItsTensorsAfterIt) {
  Trainer t(LoadRunConfig("configs/fashion_mnist.yaml",
                          {"train.epochs=2", "train.max_steps=4", "train.eval_max_steps=1",
                           "threads=2", "train.param_groups=[{params: [fc2.*], until_epoch: 1}]"}));
  const fs::path dir = testing::TestDir();
  auto snapshot = [&t] {
    std::map<std::string, Tensor> s;
    for (auto& [name, value] : t.model().StateTensors()) s[name] = value.Clone();
    return s;
  };
  auto start = snapshot();
  t.RunPass(t.config().train_graph, {.pass = "train", .epoch = 0});
  auto after_one = snapshot();
  t.RunPass(t.config().train_graph, {.pass = "train", .epoch = 1});
  auto after_two = snapshot();
  auto moved = [](const Tensor& a, const Tensor& b) {
    for (int64_t i = 0; i < a.numel(); ++i)
      if (a.At(i) != b.At(i)) return true;
    return false;
  };
  EXPECT_TRUE(moved(start["fc2.weight"], after_one["fc2.weight"]));
  EXPECT_FALSE(moved(after_one["fc2.weight"], after_two["fc2.weight"]));
  EXPECT_FALSE(moved(after_one["fc2.bias"], after_two["fc2.bias"]));
  EXPECT_TRUE(moved(after_one["fc1.weight"], after_two["fc1.weight"]));
  fs::remove_all(dir);
}

// train.eval_every: 2 over 3 epochs evaluates after epochs 2 and 3 (the
// last always); epoch 1's metrics row leaves the test columns empty.
TEST(Training, EvalEveryEvaluatesEveryNthEpochAndTheLast) {
  Trainer t(LoadRunConfig("configs/fashion_mnist.yaml",
                          {"train.epochs=3", "train.max_steps=3", "train.eval_max_steps=1",
                           "threads=2", "train.eval_every=2"}));
  const fs::path dir = testing::TestDir();
  const EpochReport r = t.Train(dir.string());
  EXPECT_GT(r.test.samples, 0);
  std::vector<bool> tested;
  for (const auto& f : MetricsRows(dir)) {
    ASSERT_GE(f.size(), 5u);
    tested.push_back(!f[3].empty());
  }
  EXPECT_EQ(tested, (std::vector<bool>{false, true, true}));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cnnflow
