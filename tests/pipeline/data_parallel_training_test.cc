// Data parallelism and exact resume through the whole YAML graph, on
// Fashion-MNIST (invariants 1, 3 and 4 of DESIGN.md):
//  - 2 replicas x batch 32 == 1 replica x batch 64 == 1 replica x batch 32
//    accumulated twice, after several SGD steps;
//  - a run resumed from a mid-epoch checkpoint ends bitwise identical to the
//    uninterrupted run, and a different config is refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "ops/io/safetensors.h"
#include "pipeline/checkpoint.h"
#include "pipeline/trainer.h"
#include "tests/testing/helpers.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

const char* kConfig = "configs/fashion_mnist.yaml";

std::vector<std::string> With(std::vector<std::string> o, const std::vector<std::string>& more) {
  o.insert(o.end(), more.begin(), more.end());
  return o;
}

// The largest |a - b| / max|a| over every parameter.
double MaxRelDiff(Model& a, Model& b) {
  double worst = 0;
  auto pa = a.NamedParameters(), pb = b.NamedParameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    const float* x = pa[i].param->value.data<float>();
    const float* y = pb[i].param->value.data<float>();
    const int64_t n = pa[i].param->value.numel();
    double scale = 1e-12;
    for (int64_t j = 0; j < n; ++j) scale = std::max(scale, std::fabs(double(x[j])));
    for (int64_t j = 0; j < n; ++j) worst = std::max(worst, std::fabs(double(x[j]) - y[j]) / scale);
  }
  return worst;
}

// MaxRelDiff of two models on any devices (their parameters copied off).
double MaxRelDiffOnHost(Model& cpu, Model& gpu) {
  auto pc = cpu.NamedParameters(), pg = gpu.NamedParameters();
  double worst = 0;
  for (size_t i = 0; i < pc.size(); ++i) {
    const Tensor a = pc[i].param->value.To(Device::Cpu()), b = pg[i].param->value.To(Device::Cpu());
    double scale = 1e-12;
    for (int64_t j = 0; j < a.numel(); ++j) scale = std::max(scale, std::fabs(a.At(j)));
    for (int64_t j = 0; j < a.numel(); ++j)
      worst = std::max(worst, std::fabs(a.At(j) - b.At(j)) / scale);
  }
  return worst;
}

// How many of a model's layers run inside another (Model's activation fusion).
int FusedLayers(const Model& m) {
  int n = 0;
  for (int i = 0; i < m.num_layers(); ++i) n += m.fused_into(i) >= 0 ? 1 : 0;
  return n;
}

// graph.fuse_activations (default true) reaches the replicas' models and a
// pipeline's; false keeps every relu a layer, and trains to the same loss
// within the fused kernels' rounding (oneDNN's relu-fused convolution).
TEST(DataParallelTraining, FuseActivationsFalseKeepsEveryReluALayer) {
  const std::vector<std::string> common = {"train.epochs=1", "train.max_steps=6", "threads=2",
                                           "train.batch=32"};
  auto train = [&](const std::vector<std::string>& more) {
    auto t = std::make_unique<Trainer>(LoadRunConfig(kConfig, With(common, more)));
    const PassMetrics m = t->RunPass(t->config().train_graph, {.pass = "train", .epoch = 0});
    return std::make_pair(std::move(t), m.mean_loss());
  };
  const auto [fused, fused_loss] = train({});
  const auto [plain, plain_loss] = train({"graph.fuse_activations=false"});
  EXPECT_EQ(FusedLayers(fused->replicas().model(0)), 2);  // conv1 and conv2 take their relus
  EXPECT_EQ(FusedLayers(plain->replicas().model(0)), 0);
  EXPECT_NEAR(fused_loss, plain_loss, 1e-3 * plain_loss);
  Trainer pipe(LoadRunConfig("configs/fashion_mnist_pipeline.yaml",
                             {"threads=2", "graph.fuse_activations=false"}));
  for (int s = 0; s < pipe.pipeline()->num_stages(); ++s)
    EXPECT_EQ(FusedLayers(pipe.pipeline()->stage_model(s)), 0) << "stage " << s;
}

TEST(DataParallelTraining, TwoReplicasAndAccumulationMatchOneBigBatch) {
  const std::vector<std::string> common = {"train.epochs=1", "train.max_steps=12", "threads=2"};
  auto train = [&](const std::vector<std::string>& more) {
    auto t = std::make_unique<Trainer>(LoadRunConfig(kConfig, With(common, more)));
    const PassMetrics m = t->RunPass(t->config().train_graph, {.pass = "train", .epoch = 0});
    EXPECT_EQ(m.samples, 12 * 64);
    return t;
  };
  auto big = train({"train.batch=64"});
  auto two = train({"train.batch=32", "graph.devices=[cpu:0, cpu:1]", "graph.bucket_mb=0.5"});
  auto acc = train({"train.batch=32", "train.max_steps=24", "train.accumulate=2"});
  auto fresh = std::make_unique<Trainer>(LoadRunConfig(kConfig, With(common, {"train.batch=64"})));
  EXPECT_EQ(two->replicas().size(), 2);
  EXPECT_GT(two->replicas().buckets().size(), 1u);
  EXPECT_EQ(big->global_step(), 12);
  EXPECT_EQ(acc->global_step(), 12);
  EXPECT_GT(MaxRelDiff(big->model(), fresh->model()), 1e-2) << "the steps moved the weights";
  // 12 SGD steps with momentum, sums in different orders: float noise only.
  EXPECT_LT(MaxRelDiff(big->model(), two->model()), 1e-4);
  EXPECT_LT(MaxRelDiff(big->model(), acc->model()), 1e-4);
  // The replicas themselves are bitwise identical.
  auto p0 = two->replicas().model(0).NamedParameters();
  auto p1 = two->replicas().model(1).NamedParameters();
  for (size_t i = 0; i < p0.size(); ++i) {
    EXPECT_EQ(std::memcmp(p0[i].param->value.raw_data(), p1[i].param->value.raw_data(),
                          p0[i].param->value.nbytes()),
              0)
        << p0[i].name;
  }
}

// A CSV file as text, one row a line, with only its first `columns`
// columns but `skip` (timing): what an exact resume must reproduce.
std::vector<std::string> CsvWithout(const fs::path& csv, std::vector<int> skip, int columns) {
  std::ifstream in(csv);
  std::vector<std::string> rows;
  for (std::string line; std::getline(in, line);) {
    std::stringstream ss(line);
    std::string row;
    int col = 0;
    for (std::string cell; std::getline(ss, cell, ',') && col < columns; ++col) {
      if (std::find(skip.begin(), skip.end(), col) == skip.end()) row += cell + ",";
    }
    rows.push_back(row);
  }
  return rows;
}

// metrics.csv without images_per_s and seconds.
std::vector<std::string> MetricsWithoutTiming(const fs::path& csv) {
  return CsvWithout(csv, {5, 6}, 100);
}
// steps.csv: step, epoch, train loss and accuracy, test loss and accuracy,
// lr (not images_per_s, data_wait_share, allreduce_share).
std::vector<std::string> StepsWithoutTiming(const fs::path& csv) { return CsvWithout(csv, {}, 7); }

// Trains `config` straight, keeping every checkpoint (the config must make
// them), then for each step of `breaks` again from the checkpoint of that
// step, as a run that died there: the final weights (every tensor of
// model.safetensors) must be bitwise equal (in dir/straight and
// dir/resumed-<step>), or within `tolerance` (relative) where the kernels
// are not deterministic (cuDNN), and metrics.csv equal but for its timing.
void ExpectResumeIsExact(const char* config_file, const std::vector<std::string>& config,
                         const fs::path& dir, double tolerance = 0,
                         const std::vector<int64_t>& breaks = {14}) {
  const fs::path straight = dir / "straight";
  int64_t steps = 0;
  {
    Trainer t(LoadRunConfig(config_file, config));
    t.Train(straight.string());
    steps = t.global_step();
  }
  const SafetensorsFile a = LoadSafetensors((straight / "model.safetensors").string());
  for (const int64_t at : breaks) {
    SCOPED_TRACE(StrCat("resumed from step ", at, " of ", steps));
    const fs::path resumed = dir / StrCat("resumed-", at);
    // A run that died after step `at`: its later files are gone.
    fs::copy(straight, resumed, fs::copy_options::recursive);
    const std::string last = CheckpointName(at) + ".zzz";
    ASSERT_TRUE(fs::exists(resumed / "checkpoints" / (CheckpointName(at) + ".json")))
        << "no checkpoint at step " << at;
    for (const auto& e : fs::directory_iterator(resumed / "checkpoints")) {
      if (e.path().filename().string() > last) fs::remove(e.path());
    }
    fs::remove(resumed / "model.safetensors");
    {
      Trainer t(LoadRunConfig(config_file, config));
      t.Resume(resumed.string());
      EXPECT_EQ(t.global_step(), at);
      t.Train();
      EXPECT_EQ(t.global_step(), steps);
    }
    const SafetensorsFile b = LoadSafetensors((resumed / "model.safetensors").string());
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    double worst = 0;
    for (const auto& [name, t] : a.tensors) {
      const Tensor* u = b.Find(name);
      ASSERT_NE(u, nullptr) << name;
      if (tolerance == 0) {
        EXPECT_EQ(std::memcmp(t.raw_data(), u->raw_data(), t.nbytes()), 0) << name;
        continue;
      }
      double scale = 1e-12, diff = 0;
      for (int64_t j = 0; j < t.numel(); ++j) {
        scale = std::max(scale, std::fabs(t.At(j)));
        diff = std::max(diff, std::fabs(t.At(j) - u->At(j)));
      }
      worst = std::max(worst, diff / scale);
      EXPECT_LT(diff / scale, tolerance) << name;
    }
    if (tolerance > 0) std::cout << "largest relative difference: " << worst << "\n";
    if (tolerance > 0) continue;
    // Every epoch's losses, accuracies, learning rate and skipped records too.
    EXPECT_EQ(MetricsWithoutTiming(straight / "metrics.csv"),
              MetricsWithoutTiming(resumed / "metrics.csv"));
    // One row a step, as the uninterrupted run logged them (the copy held
    // the rows of the later steps too, as a run that died after them would).
    EXPECT_EQ(StepsWithoutTiming(straight / "steps.csv"),
              StepsWithoutTiming(resumed / "steps.csv"));
  }
  EXPECT_GE(MetricsWithoutTiming(straight / "metrics.csv").size(), 3u) << "2 epochs expected";
}

// A user's template: the training stages are graph nodes of their own, so
// a template may list them in any order and leave out allreduce (the
// optimizer waits for the reductions itself); it trains bitwise as the
// shipped one does, on two replicas.
const char* kUserGraph = R"(train:
  nodes:
    optimizer: {stage: optimizer}
    devices:   {stage: forward_backward}
    sample:    {stage: sampler, data: train, batch: $train.batch, replicas: $graph.replicas, shuffle: true}
    metrics:   {stage: metrics}
    load:      {stage: load_batch, data: train, threads: 1}
  edges: [sample -> load -> devices, devices -> optimizer -> metrics]
eval:
  nodes:
    sample:  {stage: sampler, data: test, batch: $train.eval_batch, shuffle: false}
    load:    {stage: load_batch, data: test, threads: 1}
    step:    {stage: eval_step}
    metrics: {stage: metrics}
  edges: [sample -> load -> step -> metrics]
)";

TEST(DataParallelTraining, AUserTemplateOfTheTrainingStagesTrainsAsTheShippedOne) {
  const std::string dir = testing::TestDir();
  testing::WriteBytes(dir + "/user.yaml", kUserGraph);
  const std::vector<std::string> common = {"train.epochs=1", "train.max_steps=6", "threads=2",
                                           "train.batch=16", "graph.devices=[cpu:0, cpu:1]"};
  Trainer shipped(LoadRunConfig(kConfig, common));
  Trainer user(LoadRunConfig(kConfig, With(common, {"graph.template=" + dir + "/user.yaml"})));
  EXPECT_EQ(user.config().train_graph.Find("devices")->stage, "forward_backward");
  const PassMetrics a =
      shipped.RunPass(shipped.config().train_graph, {.pass = "train", .epoch = 0});
  const PassMetrics b = user.RunPass(user.config().train_graph, {.pass = "train", .epoch = 0});
  EXPECT_EQ(a.samples, 6 * 32);
  EXPECT_EQ(b.samples, a.samples);
  EXPECT_EQ(b.loss_sum, a.loss_sum);
  EXPECT_EQ(user.global_step(), 6);
  EXPECT_EQ(MaxRelDiff(shipped.replicas().model(0), user.replicas().model(0)), 0.0);
  EXPECT_EQ(MaxRelDiff(user.replicas().model(0), user.replicas().model(1)), 0.0);
}

// Lanes carry each batch once per replica: a plain node between the
// per-device stages would see every batch twice, so the graph is refused
// before it runs; and forward_backward without an optimizer (which lets the
// next batch in) would wait forever, so that is refused when parsed.
TEST(DataParallelTraining, BrokenLanesAreRefusedNotRun) {
  const std::string dir = testing::TestDir();
  std::string plain = kUserGraph;
  plain.replace(plain.find("devices -> optimizer"), 20, "devices -> metrics2 -> optimizer");
  plain.replace(plain.find("    metrics:   {stage: metrics}"), 0,
                "    metrics2:  {stage: prefetch, depth: 2}\n");
  testing::WriteBytes(dir + "/plain.yaml", plain);
  const std::vector<std::string> common = {"train.max_steps=2", "threads=2",
                                           "graph.devices=[cpu:0, cpu:1]"};
  Trainer t(LoadRunConfig(kConfig, With(common, {"graph.template=" + dir + "/plain.yaml"})));
  try {
    t.RunPass(t.config().train_graph, {.pass = "train", .epoch = 0});
    ADD_FAILURE() << "a plain node between per-device stages ran";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("edge devices -> metrics2: 'devices' (forward_backward) "
                                         "is per-device lanes out, 'metrics2' (prefetch) is not"),
              std::string::npos)
        << e.what();
  }

  std::string no_opt = kUserGraph;
  no_opt.replace(no_opt.find("devices -> optimizer -> metrics"), 31, "devices -> metrics");
  no_opt.replace(no_opt.find("    optimizer: {stage: optimizer}\n"), 34, "");
  testing::WriteBytes(dir + "/no_opt.yaml", no_opt);
  try {
    LoadRunConfig(kConfig, With(common, {"graph.template=" + dir + "/no_opt.yaml"}));
    ADD_FAILURE() << "forward_backward without an optimizer was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("node 'devices' (forward_backward) needs an optimizer "
                                         "node after it"),
              std::string::npos)
        << e.what();
  }
}

// The shipped template with an ema node after the optimizer.
std::string EmaTemplate(const fs::path& dir, double decay, const std::string& more = "") {
  std::string t = testing::ReadBytes("graphs/data_parallel.yaml");
  const std::string edge = "optimizer -> metrics";
  t.replace(t.rfind(edge), edge.size(),
            "optimizer -> ema -> metrics");  // the edges, not the comment
  const std::string node = "    metrics:   {stage: metrics}\n";
  t.replace(t.find(node), 0, StrCat("    ema:       {stage: ema, decay: ", decay, more, "}\n"));
  const std::string path =
      (dir / StrCat("ema-", decay, more.empty() ? "" : "-more", ".yaml")).string();
  testing::WriteBytes(path, t);
  return path;
}

// The ema stage: it does not change training (the weights are bitwise those
// of a run without it), its average follows the rule (decay 0: the weights
// themselves), it is exported as ema.*, and a resumed run continues it
// bitwise (every model.safetensors tensor, ema.* included, is compared).
TEST(DataParallelTraining, EmaAveragesWithoutChangingTrainingAndResumesExactly) {
  const fs::path dir = testing::TestDir();
  const std::vector<std::string> common = {"train.epochs=1", "train.max_steps=6", "threads=2",
                                           "train.batch=16", "graph.devices=[cpu:0, cpu:1]"};
  Trainer plain(LoadRunConfig(kConfig, common));
  Trainer zero(LoadRunConfig(kConfig, With(common, {"graph.template=" + EmaTemplate(dir, 0)})));
  Trainer half(LoadRunConfig(kConfig, With(common, {"graph.template=" + EmaTemplate(dir, 0.5)})));
  for (Trainer* t : {&plain, &zero, &half})
    t->RunPass(t->config().train_graph, {.pass = "train", .epoch = 0});
  EXPECT_EQ(MaxRelDiff(plain.replicas().model(0), half.replicas().model(0)), 0.0);
  EXPECT_EQ(MaxRelDiff(plain.replicas().model(1), half.replicas().model(1)), 0.0);
  ASSERT_NE(half.context().ema, nullptr);
  EXPECT_EQ(half.context().ema->updates(), 6);
  auto weights = zero.model().StateTensors();
  const auto& avg0 = zero.context().ema->tensors();
  const auto& avg5 = half.context().ema->tensors();
  bool moved = false;
  for (size_t i = 0; i < weights.size(); ++i) {
    EXPECT_EQ(avg0[i].first, "ema." + weights[i].first);
    EXPECT_EQ(std::memcmp(avg0[i].second.raw_data(), weights[i].second.raw_data(),
                          weights[i].second.nbytes()),
              0)
        << "decay 0 keeps the weights themselves: " << avg0[i].first;
    for (int64_t j = 0; j < weights[i].second.numel() && !moved; ++j) {
      moved = avg5[i].second.At(j) != weights[i].second.At(j);
    }
  }
  EXPECT_TRUE(moved) << "decay 0.5 averaged nothing";

  const std::vector<std::string> resume = {"train.epochs=2",
                                           "train.max_steps=20",
                                           "threads=2",
                                           "train.batch=32",
                                           "graph.devices=[cpu:0, cpu:1]",
                                           "train.checkpoint_every=7",
                                           "train.keep_checkpoints=0",
                                           "graph.template=" + EmaTemplate(dir, 0.9)};
  ExpectResumeIsExact(kConfig, resume, dir / "resume");
  const SafetensorsFile f = LoadSafetensors((dir / "resume/straight/model.safetensors").string());
  EXPECT_NE(f.Find("ema.conv1.weight"), nullptr) << "model.safetensors has no weight average";
  EXPECT_NE(f.Find("conv1.weight"), nullptr);
  fs::remove_all(dir);
}

// ema with lookahead: every 3rd step the average is updated and copied back
// into every replica's weights, which then differ from a plain run's; the
// run ends on the average; a run resumed between two updates (step 7)
// continues bitwise.
TEST(DataParallelTraining, LookaheadCopiesTheAverageIntoEveryReplicaAndResumesExactly) {
  const fs::path dir = testing::TestDir();
  const std::vector<std::string> common = {"train.epochs=1", "train.max_steps=12", "threads=2",
                                           "train.batch=16", "graph.devices=[cpu:0, cpu:1]"};
  const std::string lookahead = ", warmup: false, every: 3, lookahead: true";
  Trainer plain(LoadRunConfig(kConfig, common));
  Trainer look(
      LoadRunConfig(kConfig, With(common, {"graph.template=" + EmaTemplate(dir, 0.5, lookahead)})));
  plain.Train((dir / "plain").string());
  look.Train((dir / "look").string());
  EXPECT_EQ(look.context().ema->updates(), 4);  // after steps 3, 6, 9, 12
  EXPECT_EQ(MaxRelDiff(look.replicas().model(0), look.replicas().model(1)), 0.0);
  EXPECT_GT(MaxRelDiff(plain.replicas().model(0), look.replicas().model(0)), 1e-4);
  const auto weights = look.model().StateTensors();
  const auto& avg = look.context().ema->tensors();
  for (size_t i = 0; i < weights.size(); ++i) {
    EXPECT_EQ(std::memcmp(avg[i].second.raw_data(), weights[i].second.raw_data(),
                          weights[i].second.nbytes()),
              0)
        << "the run ends on the average: " << weights[i].first;
  }
  ExpectResumeIsExact(
      kConfig,
      {"train.epochs=2", "train.max_steps=10", "threads=2", "train.batch=16",
       "graph.devices=[cpu:0, cpu:1]", "train.checkpoint_every=7", "train.keep_checkpoints=0",
       "graph.template=" + EmaTemplate(dir, 0.6, lookahead)},
      dir / "resume", 0, {7});
  testing::ExpectContains(
      testing::ErrorOf<ConfigError>([&] {
        Trainer bad(LoadRunConfig(
            kConfig, With(common, {"graph.template=" + EmaTemplate(dir, 0.7, ", every: 0")})));
      }),
      {"ema-0.7-more.yaml:", "ema: every must be >= 1"});
  fs::remove_all(dir);
}

// A batch stage in a user's template, between the loader and the devices:
// cutmix trains two replicas on soft labels, and a resumed run mixes (and
// so ends) exactly as the uninterrupted one.
// graphs/data_parallel.yaml with `mix_node` ("{stage: cutmix, alpha: 1.0}")
// between the loader and the devices, written to `file`.
void WriteMixTemplate(const fs::path& file, const std::string& mix_node) {
  std::string t = testing::ReadBytes("graphs/data_parallel.yaml");
  const std::string edge = "load -> devices";
  t.replace(t.rfind(edge), edge.size(), "load -> mix -> devices");  // the edges, not the comment
  const std::string node = "    devices:   {stage: forward_backward}\n";
  t.replace(t.find(node), 0, "    mix:       " + mix_node + "\n");
  testing::WriteBytes(file.string(), t);
}

TEST(DataParallelTraining, CutmixBeforeTheDevicesTrainsAndResumesExactly) {
  const fs::path dir = testing::TestDir();
  WriteMixTemplate(dir / "cutmix.yaml", "{stage: cutmix, alpha: 1.0}");
  const std::vector<std::string> config = {"train.epochs=2",
                                           "train.max_steps=20",
                                           "threads=2",
                                           "train.batch=32",
                                           "graph.devices=[cpu:0, cpu:1]",
                                           "train.checkpoint_every=7",
                                           "train.keep_checkpoints=0",
                                           "graph.template=" + (dir / "cutmix.yaml").string()};
  {
    Trainer probe(LoadRunConfig(kConfig, config));
    ASSERT_EQ(probe.config().train_graph.Find("mix")->stage, "cutmix");
  }
  ExpectResumeIsExact(kConfig, config, dir / "resume");
  fs::remove_all(dir);
}

// Resume swept the DALI way (issue 16): each parallel mode, stopped at
// several points (mid-epoch, exactly at an epoch boundary, on and off an
// accumulation boundary), resumes to the bitwise end state of the
// uninterrupted run. Every case trains 2 epochs; `breaks` are the steps
// whose checkpoints it resumes from. MPI ranks: tests/cli/mpi_restart_test.sh.
struct ResumeCase {
  const char* name;
  const char* config;  // a file, or "" for the case's own (MakeConfig)
  std::vector<std::string> overrides;
  std::vector<int64_t> breaks;
  int64_t skipped_per_epoch = 0;  // bad records the data set must really have
};

// ctest names a case by its name, not its bytes.
void PrintTo(const ResumeCase& c, std::ostream* os) { *os << c.name; }

// A BatchNorm model on the Fashion-MNIST test images (no test set, so no
// evaluation pass): for sync_bn.
const char* kBatchNormConfig = R"(name: bn-resume
seed: 1
threads: 2
data:
  train: {source: idx, images: /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz,
          labels: /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz}
model:
  input: [1, 28, 28]
  layers:
    - {name: conv1, conv2d: {out: 8, kernel: 3, pad: 1, bias: false}}
    - {name: bn1, batchnorm: {}}
    - {name: relu1, relu: {}}
    - {name: pool1, maxpool2d: {kernel: 4}}
    - {name: flatten, flatten: {}}
    - {name: fc, linear: {out: 10}}
train: {epochs: 2, batch: 16, max_steps: 10, checkpoint_every: 3, keep_checkpoints: 0, log_every: 2,
        optimizer: {sgd: {lr: 0.1, momentum: 0.9}}}
graph: {devices: [cpu:0, cpu:1], sync_bn: true, collective_timeout_s: 60}
)";

// An image folder of 60 real JPEGs (the CIFAR-10 sample, 3 times) and 6
// broken ones (truncated, empty, not a JPEG), skipped: 9 batches of 8 an
// epoch, the last of 2, fewer samples where a bad one was.
const char* kBadRecordsConfig = R"(name: bad-records-resume
seed: 3
threads: 2
data:
  train: {source: folder, path: @DIR@/images, shape: [3, 32, 32], hflip: true}
  on_bad_record: skip
model:
  input: [3, 32, 32]
  layers:
    - {name: conv1, conv2d: {out: 8, kernel: 3, pad: 1}}
    - {name: relu1, relu: {}}
    - {name: pool1, maxpool2d: {kernel: 4}}
    - {name: flatten, flatten: {}}
    - {name: fc, linear: {out: 10}}
train: {epochs: 2, batch: 8, checkpoint_every: 2, keep_checkpoints: 0, log_every: 3,
        optimizer: {sgd: {lr: 0.05, momentum: 0.9}}}
graph: {devices: [cpu:0], load_threads: 2}
)";

std::string MakeConfig(const std::string& name, const fs::path& dir) {
  if (name == "sync_bn") {
    testing::WriteBytes((dir / "bn.yaml").string(), kBatchNormConfig);
    return (dir / "bn.yaml").string();
  }
  const char* src = std::getenv("CNNFLOW_SOURCE_DIR");
  const fs::path sample = fs::path(src ? src : ".") / "tests/data/cifar10-jpeg-sample";
  int bad = 0;
  for (const auto& cls : fs::directory_iterator(sample)) {
    const fs::path to = dir / "images" / cls.path().filename();
    fs::create_directories(to);
    for (const auto& img : fs::directory_iterator(cls.path())) {
      const std::string bytes = testing::ReadBytes(img.path().string());
      for (int copy = 0; copy < 3; ++copy) {
        testing::WriteBytes((to / StrCat(copy, "-", img.path().filename().string())).string(),
                            bytes);
      }
      if (bad < 6) {
        const std::string broken = bad % 3 == 0   ? bytes.substr(0, bytes.size() / 3)
                                   : bad % 3 == 1 ? std::string()
                                                  : std::string("not a JPEG at all");
        testing::WriteBytes((to / StrCat("bad-", img.path().filename().string())).string(), broken);
        ++bad;
      }
    }
  }
  std::string text = kBadRecordsConfig;
  text.replace(text.find("@DIR@"), 5, dir.string());
  testing::WriteBytes((dir / "bad.yaml").string(), text);
  return (dir / "bad.yaml").string();
}

class ResumeSweep : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(ResumeSweep, EveryBreakPointResumesBitwiseExact) {
  const ResumeCase& c = GetParam();
  const fs::path dir = testing::TestDir();
  const std::string config = *c.config ? c.config : MakeConfig(c.name, dir);
  ExpectResumeIsExact(config.c_str(), c.overrides, dir, 0, c.breaks);
  if (c.skipped_per_epoch > 0) {
    const std::vector<std::string> rows = MetricsWithoutTiming(dir / "straight/metrics.csv");
    ASSERT_EQ(rows.size(), 3u);
    for (size_t r = 1; r < rows.size(); ++r) {
      EXPECT_EQ(rows[r].substr(rows[r].rfind(',', rows[r].size() - 2) + 1),
                StrCat(c.skipped_per_epoch, ","))
          << "the data set's bad records were not all skipped: " << rows[r];
    }
  }
  fs::remove_all(dir);
}

// No test set: the evaluation passes would cost most of the time, and the
// bitwise weights already say more than the test columns would.
const std::vector<std::string> kEpochs20 = {"train.epochs=2",           "train.max_steps=20",
                                            "train.checkpoint_every=7", "train.keep_checkpoints=0",
                                            "data.test=null",           "train.log_every=5"};

INSTANTIATE_TEST_SUITE_P(
    Modes, ResumeSweep,
    ::testing::Values(
        // 2 replicas: 20 steps an epoch, checkpoints at 7, 14, 20 (the epoch's
        // end), 27, 34, 40: mid-epoch 1, the boundary, mid-epoch 2.
        ResumeCase{"replicas",
                   kConfig,
                   With(kEpochs20, {"threads=2", "train.batch=32", "graph.devices=[cpu:0, cpu:1]"}),
                   {7, 20, 27}},
        // accumulate 2 over 21 batches an epoch: 11 steps, the last a window
        // of 1 batch. Step 3 (batch 6) is on a window boundary; step 11 is
        // the epoch's end, after the short window (21 batches done, odd);
        // step 14 is mid-epoch 2, 27 batches into the run (off the run's
        // window grid, on the epoch's).
        ResumeCase{"accumulate",
                   kConfig,
                   {"train.epochs=2", "train.max_steps=21", "train.accumulate=2", "train.batch=16",
                    "threads=2", "train.checkpoint_every=3", "train.keep_checkpoints=0",
                    "data.test=null", "train.log_every=2"},
                   {3, 11, 14}},
        // SyncBN over 2 replicas (drop_last): 10 steps an epoch.
        ResumeCase{"sync_bn", "", {}, {3, 10, 13}},
        // 2 pipeline stages, 4 micro-batches, 1F1B, Adam (every stage's state).
        ResumeCase{"pipeline",
                   "configs/fashion_mnist_pipeline.yaml",
                   With(kEpochs20, {"train.optimizer={adam: {lr: 0.001}}"}),
                   {7, 20, 27}},
        // on_bad_record: skip over a folder with 6 bad JPEGs of 66: 9 batches
        // an epoch, checkpoints at 2, 4, 6, 8, 9 (the end), 11, ...
        ResumeCase{"bad_records", "", {}, {2, 9, 13}, 6}),
    [](const ::testing::TestParamInfo<ResumeCase>& info) { return std::string(info.param.name); });

// A checkpoint of another config is refused, naming both hashes.
TEST(DataParallelTraining, ResumingWithAnotherConfigIsRefused) {
  const std::vector<std::string> config = {"train.epochs=1", "train.max_steps=2", "threads=2",
                                           "train.batch=8", "data.test=null"};
  const fs::path dir = testing::TestDir();
  {
    Trainer t(LoadRunConfig(kConfig, config));
    t.Train(dir.string());
  }
  Trainer other(LoadRunConfig(kConfig, With(config, {"train.optimizer={sgd: {lr: 0.02}}"})));
  try {
    other.Resume(dir.string());
    FAIL() << "expected a config mismatch";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("was written by a different run: "
                                         "train.optimizer.sgd.lr is 0.01 there, 0.02 here"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// Tensor parallelism through the graph (graph.tensor_parallel): 2 devices
// splitting conv2 (column, gathered) and fc1 -> fc2 (a column-row pair)
// train as 1 device on the same batch; DP x TP (2 x 2) as well; and the
// split run evaluates as the unsplit one and resumes exactly.
TEST(TensorParallelTraining, SplitLayersTrainAsOneDeviceAndResumeExactly) {
  const std::string split =
      "graph.tensor_parallel={size: 2, layers: {conv2: column, fc1: column, fc2: row}}";
  const std::vector<std::string> common = {"train.epochs=1", "train.max_steps=12", "threads=2"};
  // One trainer at a time: each caps the process's threads (tbb::global_control).
  struct Trained {
    std::unique_ptr<Model> model;  // a copy of replica 0's
    PassMetrics eval;
  };
  auto train = [&](const std::vector<std::string>& more, int data_parallel) {
    Trainer t(LoadRunConfig(kConfig, With(common, more)));
    const PassMetrics m = t.RunPass(t.config().train_graph, {.pass = "train", .epoch = 0});
    EXPECT_EQ(m.samples, 12 * 64);
    EXPECT_EQ(t.replicas().data_parallel(), data_parallel);
    Trained out{Model::Build(t.config().layers, t.config().input_shape), t.Evaluate()};
    CopyNamedTensors(t.model().StateTensors(), out.model->StateTensors(), "the trained model");
    return out;
  };
  const Trained one = train({"train.batch=64"}, 1);
  const Trained tp = train({"train.batch=64", "graph.devices=[cpu:0, cpu:1]", split}, 1);
  const Trained dptp = train(
      {"train.batch=32", "graph.devices=[cpu:0, cpu:1, cpu:2, cpu:3]", "threads=4", split}, 2);
  EXPECT_LT(MaxRelDiff(*one.model, *tp.model), 1e-4);
  EXPECT_LT(MaxRelDiff(*one.model, *dptp.model), 1e-4);
  EXPECT_EQ(tp.eval.samples, 10000);
  EXPECT_NEAR(one.eval.mean_loss(), tp.eval.mean_loss(), 1e-4);
  EXPECT_NEAR(static_cast<double>(one.eval.correct), static_cast<double>(tp.eval.correct), 3);

  const std::vector<std::string> config = {
      "train.epochs=2",           "train.max_steps=20",           "threads=2",
      "train.batch=32",           "graph.devices=[cpu:0, cpu:1]", split,
      "train.checkpoint_every=7", "train.keep_checkpoints=0"};
  const fs::path dir = testing::TestDir();
  ExpectResumeIsExact(kConfig, config, dir);
  fs::remove_all(dir);
}

// Invariant 2 through the graph: the pipeline config (2 stages, 4
// micro-batches) trains like one device, for both schedules (its resume is
// ResumeSweep's pipeline case).
TEST(PipelineTraining, PipelineMatchesOneDeviceForBothSchedules) {
  const std::vector<std::string> common = {"train.epochs=1", "train.max_steps=12", "threads=2"};
  Trainer one(LoadRunConfig(kConfig, common));
  one.RunPass(one.config().train_graph, {.pass = "train", .epoch = 0});
  for (const std::string schedule : {"1f1b", "gpipe"}) {
    Trainer pipe(LoadRunConfig("configs/fashion_mnist_pipeline.yaml",
                               With(common, {"graph.pipeline.schedule=" + schedule})));
    ASSERT_NE(pipe.pipeline(), nullptr);
    pipe.RunPass(pipe.config().train_graph, {.pass = "train", .epoch = 0});
    EXPECT_EQ(pipe.global_step(), 12);
    EXPECT_LT(MaxRelDiff(one.model(), pipe.model()), 1e-4) << schedule;
    const std::vector<int> held = pipe.pipeline()->max_held();
    if (schedule == "1f1b") {
      EXPECT_EQ(held, (std::vector<int>{2, 1}));
    } else {
      EXPECT_EQ(held, (std::vector<int>{4, 4}));
    }
  }
  // Its resume: ResumeSweep's pipeline case.
}

// train.drop_last: an epoch of 100 samples at batch 32 is 4 steps (the last
// of 4 samples) without it, 3 full ones with it, through the template's
// sampler and the trainer's step count alike.
TEST(DataParallelTraining, DropLastDropsTheShortLastBatch) {
  const fs::path dir = testing::TestDir();
  const std::string config = (dir / "drop.yaml").string();
  std::ofstream(config) << R"(name: drop_last
seed: 1
threads: 2
data:
  train: {source: synthetic, shape: [1, 4, 4], classes: 3, size: 100, seed: 1}
model:
  input: [1, 4, 4]
  layers:
    - {name: flatten, flatten: {}}
    - {name: fc, linear: {out: 3}}
train: {epochs: 1, batch: 32, optimizer: {sgd: {lr: 0.1}}}
)";
  for (const bool drop : {false, true}) {
    Trainer t(LoadRunConfig(config, {StrCat("train.drop_last=", drop ? "true" : "false")}));
    const PassMetrics m = t.RunPass(t.config().train_graph, {.pass = "train", .epoch = 0});
    EXPECT_EQ(m.samples, drop ? 96 : 100) << "drop_last " << drop;
    EXPECT_EQ(t.global_step(), drop ? 3 : 4) << "drop_last " << drop;
  }
  // A set smaller than one batch would train nothing: refused, saying why.
  try {
    Trainer t(LoadRunConfig(config, {"train.drop_last=true", "train.batch=128"}));
    t.Train((dir / "run").string());
    ADD_FAILURE() << "an epoch of no batch was not refused";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("100 samples make no full batch of 128"));
  }
  fs::remove_all(dir);
}

// More replicas than cores, with SyncBN (every replica blocks in each
// BatchNorm until all arrive): each needs a thread of its own, which the
// run's arena of `threads` slots gives, whatever the core count.
TEST(DataParallelTraining, ThreeSyncBnReplicasOnTwoCoresDoNotDeadlock) {
  const fs::path dir = testing::TestDir();
  const std::string config = (dir / "bn.yaml").string();
  std::ofstream(config) << R"(name: bn3
seed: 1
threads: 3
data:
  train: {source: idx, images: /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz,
          labels: /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz}
model:
  input: [1, 28, 28]
  layers:
    - {name: conv1, conv2d: {out: 4, kernel: 3, pad: 1, bias: false}}
    - {name: bn1, batchnorm: {}}
    - {name: relu1, relu: {}}
    - {name: pool1, maxpool2d: {kernel: 4}}
    - {name: flatten, flatten: {}}
    - {name: fc, linear: {out: 10}}
train: {epochs: 1, batch: 10, max_steps: 4, optimizer: {sgd: {lr: 0.1}}}
graph: {devices: [cpu:0, cpu:1, cpu:2], sync_bn: true, collective_timeout_s: 30}
)";
  Trainer t(LoadRunConfig(config));
  const PassMetrics m = t.RunPass(t.config().train_graph, {.pass = "train", .epoch = 0});
  EXPECT_EQ(m.samples, 4 * 30);
  EXPECT_EQ(t.global_step(), 4);
  fs::remove_all(dir);
}

// The same config on cuda:0 as on cpu:0 by changing the device list (issue
// 6), through the whole graph: batches staged to the GPU, losses read back
// asynchronously. Synthetic data, so the GPU machine needs no data set.
TEST(DataParallelTrainingGPU, TheSameConfigTrainsOnAGpuAsOnTheCpu) {
  if (!CudaAvailable()) GTEST_SKIP() << "no GPU found: GPU test skipped";
  const std::vector<std::string> common = {"train.epochs=1", "train.max_steps=20", "threads=2",
                                           "graph.load_threads=1"};
  const char* config = "bench/configs/mlp2_synthetic.yaml";
  auto train = [&](const std::string& devices, const std::string& precision) {
    auto t = std::make_unique<Trainer>(LoadRunConfig(
        config, With(common, {"graph.devices=[" + devices + "]", "graph.precision=" + precision})));
    const PassMetrics m = t->RunPass(t->config().train_graph, {.pass = "train", .epoch = 0});
    EXPECT_EQ(m.samples, 20 * 64) << devices << " " << precision;
    return std::make_pair(std::move(t), m);
  };
  auto [cpu, cpu_m] = train("cpu:0", "fp32");
  auto [gpu, gpu_m] = train("cuda:0", "fp32");
  auto [half, half_m] = train("cuda:0", "bf16");
  EXPECT_EQ(gpu->model().device(), Device::Cuda(0));
  EXPECT_NEAR(gpu_m.mean_loss(), cpu_m.mean_loss(), 1e-2 * cpu_m.mean_loss());
  EXPECT_NEAR(half_m.mean_loss(), cpu_m.mean_loss(), 5e-2 * cpu_m.mean_loss());
  // 20 SGD steps with momentum from the same start: TF32 noise only.
  EXPECT_LT(MaxRelDiffOnHost(cpu->model(), gpu->model()), 1e-2);
}

// One GPU listed twice (issue 55): two replicas on cuda:0, each in its own
// lane (stream and pool), their gradients summed on the device in the
// reduction tree's order (ops/cuda/lane_group.h), equal one replica at the
// doubled batch to f32 rounding after 20 steps (TF32 off, deterministic
// algorithms), and equal each other bit for bit.
TEST(DataParallelTrainingGPU, TwoReplicasOnOneGpuMatchOneAtTheDoubledBatch) {
  if (!CudaAvailable()) GTEST_SKIP() << "no GPU found: GPU test skipped";
  const std::vector<std::string> common = {
      "train.epochs=1",   "train.max_steps=20",       "threads=2",          "graph.load_threads=1",
      "graph.tf32=false", "graph.deterministic=true", "graph.bucket_mb=0.5"};
  auto train = [&](const std::string& devices, int batch) {
    auto t = std::make_unique<Trainer>(LoadRunConfig(
        "bench/configs/mlp2_synthetic.yaml",
        With(common, {"graph.devices=[" + devices + "]", "train.batch=" + std::to_string(batch)})));
    const PassMetrics m = t->RunPass(t->config().train_graph, {.pass = "train", .epoch = 0});
    EXPECT_EQ(m.samples, 20 * 64) << devices;
    return t;
  };
  auto one = train("cuda:0", 64);
  auto two = train("cuda:0, cuda:0", 32);
  ASSERT_EQ(two->replicas().size(), 2);
  EXPECT_EQ(two->replicas().lane(1), 1);
  // Each lane's phases as its GPU spent them (the per-rank step table's).
  for (int r = 0; r < 2; ++r) {
    const auto& busy = two->replicas().counters(r).gpu_busy_seconds;
    for (int p = 0; p < kGpuPhases; ++p) EXPECT_GT(busy[p], 0) << "replica " << r << " phase " << p;
  }
  EXPECT_GT(two->replicas().buckets().size(), 1u);
  auto p0 = two->replicas().model(0).NamedParameters();
  auto p1 = two->replicas().model(1).NamedParameters();
  for (size_t i = 0; i < p0.size(); ++i) {
    const Tensor a = p0[i].param->value.To(Device::Cpu()), b = p1[i].param->value.To(Device::Cpu());
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << p0[i].name;
  }
  EXPECT_LT(MaxRelDiffOnHost(one->model(), two->replicas().model(0)), 1e-5);
}

// Pipelines on one GPU (issue 60), a lane per stage: the CPU pipeline
// configs with graph.devices changed train as the unsplit model on the same
// GPU accumulating over the same micro-batches (batch 64 in 4 micro-batches
// against batch 16 x accumulate 4: per-micro-batch BN alike), in f32 with
// full f32 convolutions and deterministic algorithms. The small CNN and
// ResNet-18 (cut by stages: auto between residual blocks), both schedules;
// the stages' GPU time is counted, and evaluation runs through the stages.
TEST(PipelineTrainingGPU, PipelinesOnOneGpuMatchTheUnsplitModelAccumulating) {
  if (!CudaAvailable()) GTEST_SKIP() << "no GPU found: GPU test skipped";
  const std::vector<std::string> common = {"train.epochs=1", "threads=2", "graph.load_threads=1",
                                           "graph.tf32=false", "graph.deterministic=true"};
  struct Case {
    const char* config;
    std::vector<std::string> unsplit, pipeline;
  };
  // Synthetic data: the GPU machine has no data sets.
  const std::string train =
      "data.train={source: synthetic, shape: [1, 28, 28], classes: 10, size: 4096, seed: 1}";
  const std::string test =
      "data.test={source: synthetic, shape: [1, 28, 28], classes: 10, size: 512, seed: 2}";
  const std::vector<Case> cases = {
      {"configs/fashion_mnist_pipeline.yaml",
       {train, test, "graph.pipeline={}", "graph.template=graphs/data_parallel.yaml",
        "graph.devices=[cuda:0]"},
       {train, test, "graph.devices=[cuda:0, cuda:0]"}},
      {"bench/configs/resnet18_synthetic.yaml",
       {"graph.devices=[cuda:0]"},
       {"graph.devices=[cuda:0, cuda:0]", "graph.template=graphs/pipeline_parallel.yaml",
        "graph.pipeline={stages: auto, microbatches: 4}"}},
  };
  for (const Case& c : cases) {
    auto unsplit = std::make_unique<Trainer>(LoadRunConfig(
        c.config, With(With(common, c.unsplit),
                       {"train.batch=16", "train.accumulate=4", "train.max_steps=80"})));
    unsplit->RunPass(unsplit->config().train_graph, {.pass = "train", .epoch = 0});
    ASSERT_EQ(unsplit->global_step(), 20) << c.config;
    for (const std::string schedule : {"1f1b", "gpipe"}) {
      SCOPED_TRACE(StrCat(c.config, " ", schedule));
      Trainer pipe(LoadRunConfig(
          c.config, With(With(common, c.pipeline), {"train.batch=64", "train.max_steps=20",
                                                    "graph.pipeline.schedule=" + schedule,
                                                    "graph.pipeline.microbatches=4"})));
      ASSERT_NE(pipe.pipeline(), nullptr);
      ASSERT_EQ(pipe.pipeline()->lane(1), 1);
      const PassMetrics m = pipe.RunPass(pipe.config().train_graph, {.pass = "train", .epoch = 0});
      EXPECT_EQ(m.samples, 20 * 64);
      EXPECT_TRUE(std::isfinite(m.mean_loss()));
      EXPECT_LT(MaxRelDiffOnHost(unsplit->model(), pipe.model()), 1e-5);
      for (double busy : pipe.pipeline()->busy_seconds()) EXPECT_GT(busy, 0);
      for (double idle : pipe.pipeline()->bubble()) EXPECT_LT(idle, 1);
      if (pipe.config().data.count("test") != 0) {
        const PassMetrics pe = pipe.Evaluate(), ue = unsplit->Evaluate();
        EXPECT_NEAR(pe.mean_loss(), ue.mean_loss(), 1e-4);
      }
    }
  }
}

// Tensor parallelism on one GPU (issue 60), each member a lane of it: the
// small CNN's column-row pair and column conv over 2 members, and DP x TP
// (2 x 2 on 4 lanes), train as the unsplit model on that GPU (full f32
// math, deterministic algorithms) and evaluate alike through the group;
// ResNet-18 at 224 with its convolutions split over 2 lanes trains as
// unsplit to 1e-4 after 12 steps, as on CPUs.
TEST(TensorParallelTrainingGPU, SplitLayersOnLanesOfOneGpuTrainAsUnsplit) {
  if (!CudaAvailable()) GTEST_SKIP() << "no GPU found: GPU test skipped";
  const std::vector<std::string> common = {
      "train.epochs=1",   "train.max_steps=12",       "threads=4",
      "graph.tf32=false", "graph.deterministic=true", "graph.load_threads=1"};
  const std::vector<std::string> fashion = {
      "data.train={source: synthetic, shape: [1, 28, 28], classes: 10, size: 4096, seed: 1}",
      "data.test={source: synthetic, shape: [1, 28, 28], classes: 10, size: 512, seed: 2}"};
  const std::string split =
      "graph.tensor_parallel={size: 2, layers: {conv2: column, fc1: column, fc2: row}}";
  auto train = [&](const char* config, std::vector<std::string> more) {
    auto t = std::make_unique<Trainer>(LoadRunConfig(config, With(common, more)));
    t->RunPass(t->config().train_graph, {.pass = "train", .epoch = 0});
    EXPECT_EQ(t->global_step(), 12) << config;
    return t;
  };
  auto one = train(kConfig, With(fashion, {"train.batch=64", "graph.devices=[cuda:0]"}));
  auto tp =
      train(kConfig, With(fashion, {"train.batch=64", "graph.devices=[cuda:0, cuda:0]", split}));
  auto dptp = train(
      kConfig,
      With(fashion, {"train.batch=32", "graph.devices=[cuda:0, cuda:0, cuda:0, cuda:0]", split}));
  EXPECT_EQ(tp->replicas().data_parallel(), 1);
  EXPECT_EQ(dptp->replicas().data_parallel(), 2);
  EXPECT_LT(MaxRelDiffOnHost(one->model(), tp->model()), 1e-5);
  EXPECT_LT(MaxRelDiffOnHost(one->model(), dptp->model()), 1e-5);
  const PassMetrics e1 = one->Evaluate(), etp = tp->Evaluate();
  EXPECT_EQ(etp.samples, 512);
  EXPECT_NEAR(e1.mean_loss(), etp.mean_loss(), 1e-5);
  EXPECT_EQ(e1.correct, etp.correct);

  const char* resnet = "bench/configs/resnet18_224_tensor_parallel.yaml";
  auto r_one = train(resnet, {"graph.devices=[cuda:0]", "graph.tensor_parallel={}"});
  auto r_tp = train(resnet, {"graph.devices=[cuda:0, cuda:0]"});
  EXPECT_EQ(r_tp->replicas().tensor_parallel(), 2);
  EXPECT_LT(MaxRelDiffOnHost(r_one->model(), r_tp->model()), 1e-4);
}

// Mixed labels on a GPU (issue 55): a mixup config trains on cuda:0 by
// changing graph.devices alone, the mix staged with the labels and taken by
// the GPU loss: close to the same config on cpu:0 (full f32 convolutions,
// graph.tf32: false, so only the order of f32 sums differs), and not to the
// run without the mix (so the mix is not dropped on the way).
TEST(DataParallelTrainingGPU, MixupTrainsOnAGpuAsOnTheCpu) {
  if (!CudaAvailable()) GTEST_SKIP() << "no GPU found: GPU test skipped";
  const fs::path dir = testing::TestDir();
  WriteMixTemplate(dir / "mixup.yaml", "{stage: mixup, alpha: 0.4}");
  const std::vector<std::string> common = {"train.epochs=1", "train.max_steps=20", "threads=2",
                                           "graph.load_threads=1", "graph.tf32=false"};
  auto train = [&](const std::string& devices, bool mix) {
    std::vector<std::string> o = With(common, {"graph.devices=[" + devices + "]"});
    if (mix) o.push_back("graph.template=" + (dir / "mixup.yaml").string());
    auto t = std::make_unique<Trainer>(LoadRunConfig("bench/configs/mlp2_synthetic.yaml", o));
    const PassMetrics m = t->RunPass(t->config().train_graph, {.pass = "train", .epoch = 0});
    EXPECT_EQ(m.samples, 20 * 64) << devices;
    return std::make_pair(std::move(t), m);
  };
  auto [cpu, cpu_m] = train("cpu:0", true);
  auto [gpu, gpu_m] = train("cuda:0", true);
  auto [hard, hard_m] = train("cuda:0", false);
  EXPECT_NEAR(gpu_m.mean_loss(), cpu_m.mean_loss(), 1e-3 * cpu_m.mean_loss());
  const double mixed = MaxRelDiffOnHost(cpu->model(), gpu->model());
  EXPECT_LT(mixed, 1e-3);
  EXPECT_GT(MaxRelDiffOnHost(cpu->model(), hard->model()), 2 * mixed)
      << "the GPU run without the mix is as close to the CPU's mixed run as the GPU's mixed one";
  fs::remove_all(dir);
}

// graph.deterministic on a GPU (issue 55): two identical runs end with the
// same bytes, the run folder keeps each convolution's cuDNN picks
// (cudnn-picks.tsv), and a resume from a checkpoint, which loads them, ends
// bitwise as the uninterrupted run (without the key it is only close: the
// test below). The picks of one process are kept in memory too, so the
// second run here meets the first's; cuDNN's heuristics give it the same
// ones anyway (no timing in this mode).
TEST(DataParallelTrainingGPU, DeterministicRunsRepeatBitwiseAndResumeWithTheirPicks) {
  if (!CudaAvailable()) GTEST_SKIP() << "no GPU found: GPU test skipped";
  const char* config_file = "bench/configs/mlp2_synthetic.yaml";
  const std::vector<std::string> config = {
      "train.epochs=2",          "train.max_steps=20",       "threads=2",
      "graph.devices=[cuda:0]",  "train.checkpoint_every=7", "train.keep_checkpoints=0",
      "graph.deterministic=true"};
  const fs::path dir = testing::TestDir();
  for (const char* run : {"a", "b"}) {
    Trainer t(LoadRunConfig(config_file, config));
    t.Train((dir / run).string());
  }
  EXPECT_EQ(testing::ReadBytes((dir / "a" / "model.safetensors").string()),
            testing::ReadBytes((dir / "b" / "model.safetensors").string()))
      << "two deterministic GPU runs differ";
  const std::string picks = testing::ReadBytes((dir / "a" / "cudnn-picks.tsv").string());
  // conv1 and conv2, forward, backward-data and backward-filter at batch 64.
  for (const char* pass : {"\tforward ", "\tbackward-data ", "\tbackward-filter "})
    EXPECT_NE(picks.find(pass), std::string::npos) << pass << " in\n" << picks;
  ExpectResumeIsExact(config_file, config, dir / "resume");
  EXPECT_EQ(testing::ReadBytes((dir / "resume" / "resumed-14" / "cudnn-picks.tsv").string()),
            testing::ReadBytes((dir / "resume" / "straight" / "cudnn-picks.tsv").string()));
  fs::remove_all(dir);
}

// A GPU run's checkpoints (weights, BN buffers, optimizer state copied off
// the GPU) resume on the GPU: close to the uninterrupted run. Not bitwise:
// cuDNN's fastest algorithms are not deterministic, and the resumed run
// searches its algorithms again (by timing). SGD: Adam's per-element step
// turns that rounding into full steps either way (on an H200, 40 Adam steps
// ended up to 5% apart).
TEST(DataParallelTrainingGPU, ResumedGpuRunEndsCloseToTheUninterruptedOne) {
  if (!CudaAvailable()) GTEST_SKIP() << "no GPU found: GPU test skipped";
  const std::vector<std::string> config = {
      "train.epochs=2",         "train.max_steps=20",       "threads=2",
      "graph.devices=[cuda:0]", "train.checkpoint_every=7", "train.keep_checkpoints=0"};
  const fs::path dir = testing::TestDir();
  ExpectResumeIsExact("bench/configs/mlp2_synthetic.yaml", config, dir, 1e-2);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cnnflow
