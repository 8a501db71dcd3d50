// Config errors say file, line, column, key and what was expected, and
// suggest the closest known name. Each case asserts on the message text.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "ops/cpu/onednn.h"
#include "ops/model.h"
#include "pipeline/run_config.h"
#include "tests/testing/helpers.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

// A valid config; each test breaks one thing in it.
constexpr const char* kGood = R"(name: t
data:
  train: {source: idx, images: a.gz, labels: b.gz}
model:
  input: [1, 28, 28]
  layers:
    - {name: conv1, conv2d: {out: 4, kernel: 3, pad: 1}}
    - {name: pool1, maxpool2d: {kernel: 2}}
    - {name: flatten, flatten: {}}
    - {name: fc1, linear: {in: 784, out: 10}}
train:
  epochs: 1
  batch: 8
  optimizer: {sgd: {lr: 0.1}}
)";

class ConfigTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text, const std::string& name = "cfg.yaml") {
    if (dir_.empty()) dir_ = testing::TestDir();
    const std::string path = (fs::path(dir_) / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::string dir_;
  static std::string Replace(std::string s, const std::string& from, const std::string& to) {
    const auto pos = s.find(from);
    EXPECT_NE(pos, std::string::npos) << from;
    return s.replace(pos, from.size(), to);
  }
  // The message of the ConfigError that loading `text` throws.
  std::string ErrorOf(const std::string& text, const std::vector<std::string>& sets = {}) {
    const std::string path = Write(text);
    try {
      LoadRunConfig(path, sets);
    } catch (const ConfigError& e) {
      const std::string msg = e.what();  // starts with the config's path, which varies
      return msg.rfind(path, 0) == 0 ? msg.substr(path.size()) : msg;
    }
    ADD_FAILURE() << "no error";
    return "";
  }
};

TEST_F(ConfigTest, GoodConfigLoadsWithDefaults) {
  RunConfig c = LoadRunConfig(Write(kGood));
  EXPECT_EQ(c.name, "t");
  EXPECT_EQ(c.batch, 8);
  EXPECT_EQ(c.layers.size(), 4u);
  EXPECT_EQ(c.layers[0].args.Ints("kernel", 2), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(c.optimizer.type, "sgd");
  // sample, prefetch, load, devices, allreduce, optimizer, metrics.
  EXPECT_EQ(c.train_graph.nodes.size(), 7u);
  EXPECT_EQ(c.train_graph.Find("devices")->stage, "forward_backward");
  // $train.batch in the template resolved from this config.
  EXPECT_EQ(c.train_graph.Find("sample")->args.Int("batch"), 8);
}

// A choice offering true and false (an image source's hflip) reads YAML's
// bools as a bool key does, whatever the spelling; other values are checked.
TEST_F(ConfigTest, ChoiceWithTrueAndFalseTakesYamlBools) {
  const std::string good = Replace(kGood, "{source: idx, images: a.gz, labels: b.gz}",
                                   "{source: cifar, path: c.bin, hflip: HFLIP}");
  for (const auto& [given, want] :
       std::vector<std::pair<std::string, std::string>>{{"true", "true"},
                                                        {"yes", "true"},
                                                        {"True", "true"},
                                                        {"no", "false"},
                                                        {"False", "false"},
                                                        {"alternate", "alternate"}}) {
    const RunConfig c = LoadRunConfig(Write(Replace(good, "HFLIP", given)));
    EXPECT_EQ(c.data.at("train").args.String("hflip"), want) << given;
  }
  testing::ExpectContains(ErrorOf(Replace(good, "HFLIP", "sometimes")),
                          {"key 'hflip': unknown value 'sometimes'", "false, true, alternate"});
}

// train.init is checked like every section: known keys, a weights file.
TEST_F(ConfigTest, TrainInitNeedsWeightsAndKnownKeys) {
  testing::ExpectContains(
      ErrorOf(Replace(kGood, "  epochs: 1", "  epochs: 1\n  init: {strict: false}")),
      {"train.init", "needs weights: FILE (.safetensors or .pth)"});
  testing::ExpectContains(
      ErrorOf(Replace(kGood, "  epochs: 1",
                      "  epochs: 1\n  init: {weights: w.safetensors, skp: [fc.*]}")),
      {"unknown key 'skp' (did you mean 'skip'?)"});
}

TEST_F(ConfigTest, MisspeltKeySuggestsTheKnownOne) {
  EXPECT_EQ(ErrorOf(Replace(kGood, "  epochs: 1", "  epohcs: 1")),
            ":12:3: train: unknown key 'epohcs' (did you mean 'epochs'?); known: epochs, batch, "
            "optimizer, freeze, frozen_bn, param_groups, schedule, eval_batch, eval_every, tta, "
            "drop_last, max_steps, "
            "eval_max_steps, accumulate, "
            "checkpoint_every, "
            "keep_checkpoints, log_every, init");
}

TEST_F(ConfigTest, NegativeLogEveryIsAnError) {
  const std::string msg = ErrorOf(Replace(kGood, "  epochs: 1", "  epochs: 1\n  log_every: -1"));
  EXPECT_NE(msg.find("train.log_every"), std::string::npos) << msg;
  EXPECT_NE(msg.find("must be >= 0"), std::string::npos) << msg;
}

TEST_F(ConfigTest, MisspeltLayerParameter) {
  const std::string msg = ErrorOf(Replace(kGood, "kernel: 3, pad", "kernal: 3, pad"));
  EXPECT_EQ(msg.substr(0, 80),
            ":7:38: layer 'conv1' (conv2d): unknown key 'kernal' (did you mean 'kernel'?); kn");
}

TEST_F(ConfigTest, UnknownLayerTypeSuggestsClosest) {
  const std::string msg = ErrorOf(Replace(kGood, "conv1, conv2d:", "conv1, conv2:"));
  EXPECT_NE(msg.find(":7:21: layer 'conv1': unknown layer type 'conv2' (did you mean 'conv2d'?)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("known: "), std::string::npos) << msg;
}

TEST_F(ConfigTest, WrongTypeSaysWhatWasExpected) {
  EXPECT_EQ(ErrorOf(Replace(kGood, "batch: 8", "batch: eight")),
            ":13:10: train: key 'batch': expected int, got 'eight'");
}

TEST_F(ConfigTest, MissingRequiredKey) {
  const std::string msg = ErrorOf(Replace(kGood, "  epochs: 1\n", ""));
  EXPECT_NE(msg.find("train: missing required key 'epochs'"), std::string::npos) << msg;
}

TEST_F(ConfigTest, OverrideErrorsNameTheOverride) {
  const std::string path = Write(kGood);
  try {
    LoadRunConfig(path, {"train.batch=abc"});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "--set train.batch=abc: train: key 'batch': expected int, got 'abc'");
  }
  RunConfig c = LoadRunConfig(path, {"train.epochs=3", "model.layers.0.name=first"});
  EXPECT_EQ(c.epochs, 3);
  EXPECT_EQ(c.layers[0].name, "first");
  try {
    LoadRunConfig(path, {"model.layers.9.name=x"});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "--set model.layers.9.name=x: '9' is not an index of the list (size 4)");
  }
}

TEST_F(ConfigTest, UnknownStageTypeInTemplateSuggestsClosest) {
  const std::string tmpl = Write(R"(train:
  nodes:
    sample: {stage: sampler, batch: $train.batch}
    prefetch: {stage: prefech, depth: 2}
  edges: [sample -> prefetch]
eval:
  nodes:
    sample: {stage: sampler, batch: 4}
  edges: []
)",
                                 "tmpl.yaml");
  const std::string msg = ErrorOf(std::string(kGood) + "graph: {template: " + tmpl + "}\n");
  EXPECT_NE(msg.find("tmpl.yaml:4:23: node 'prefetch': unknown stage type 'prefech' (did you mean "
                     "'prefetch'?); known: "),
            std::string::npos)
      << msg;
}

TEST_F(ConfigTest, TemplateVariableMissingFromRun) {
  const std::string tmpl = Write(R"(train:
  nodes:
    sample: {stage: sampler, batch: $train.microbatch}
  edges: []
)",
                                 "tmpl2.yaml");
  const std::string msg = ErrorOf(std::string(kGood) + "graph: {template: " + tmpl + "}\n");
  EXPECT_NE(msg.find("tmpl2.yaml:3:37: node 'sample': '$train.microbatch' is not set in "),
            std::string::npos)
      << msg;
}

TEST_F(ConfigTest, YamlSyntaxErrorHasLineAndColumn) {
  const std::string msg = ErrorOf(Replace(kGood, "epochs: 1", "epochs: [1"));
  EXPECT_NE(msg.find(":13:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("YAML syntax error"), std::string::npos) << msg;
}

TEST_F(ConfigTest, ShapeMismatchNamesBothLayersAndShapes) {
  // A stride-2 conv makes the flattened features 196, not the 784 fc1 says.
  RunConfig c =
      LoadRunConfig(Write(Replace(kGood, "kernel: 3, pad: 1", "kernel: 3, pad: 1, stride: 2")));
  try {
    Model::Build(c.layers, c.input_shape);
    FAIL();
  } catch (const ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(
        msg.find("shape mismatch at layer 'fc1' (linear): 'flatten' (flatten) produces [196]"),
        std::string::npos)
        << msg;
    EXPECT_NE(msg.find("784"), std::string::npos) << msg;
  }
}

TEST_F(ConfigTest, AddOfDifferentShapesNamesBothInputs) {
  RunConfig c = LoadRunConfig(Write(Replace(
      kGood, "    - {name: flatten, flatten: {}}\n",
      "    - {name: res, add: {}, inputs: [conv1, pool1]}\n    - {name: flatten, flatten: {}}\n")));
  try {
    Model::Build(c.layers, c.input_shape);
    FAIL();
  } catch (const ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("at layer 'res' (add): 'conv1' (conv2d) produces [4, 28, 28] and 'pool1' "
                       "(maxpool2d) produces [4, 14, 14]"),
              std::string::npos)
        << msg;
  }
}

// `cnnflow tune --write`: the setting goes into the text, the rest stays.
TEST(SetYamlScalar, ReplacesAValueWhereItStandsKeepingComments) {
  const std::string text =
      "# my run\nname: x  # named\ngraph: {template: g.yaml, prefetch: 4, load_threads: 1}  # "
      "keep\n";
  std::string out = SetYamlScalar(text, "graph.load_threads", "2", "c.yaml");
  out = SetYamlScalar(out, "graph.prefetch", "16", "c.yaml");
  EXPECT_EQ(out,
            "# my run\nname: x  # named\ngraph: {template: g.yaml, prefetch: 16, load_threads: 2}  "
            "# keep\n");
}

TEST(SetYamlScalar, AddsAMissingKeyToFlowAndBlockSections) {
  EXPECT_EQ(SetYamlScalar("graph: {devices: [cpu:0]}\nseed: 1\n", "graph.prefetch", "8", "c"),
            "graph: {devices: [cpu:0], prefetch: 8}\nseed: 1\n");
  EXPECT_EQ(SetYamlScalar("graph: {}\n", "graph.prefetch", "8", "c"), "graph: {prefetch: 8}\n");
  EXPECT_EQ(SetYamlScalar("graph:\n  # the template\n  template: g.yaml\nseed: 1\n",
                          "graph.prefetch", "8", "c"),
            "graph:\n  # the template\n  prefetch: 8\n  template: g.yaml\nseed: 1\n");
  EXPECT_EQ(SetYamlScalar("seed: 1", "graph.prefetch", "8", "c"),
            "seed: 1\ngraph: {prefetch: 8}\n");
  // Block values, with comments after them.
  EXPECT_EQ(SetYamlScalar("graph:\n  prefetch: 4   # why\n  load_threads: 1\n", "graph.prefetch",
                          "2", "c"),
            "graph:\n  prefetch: 2   # why\n  load_threads: 1\n");
}

TEST(SetYamlScalar, RefusesToReplaceACollection) {
  try {
    SetYamlScalar("graph: {prefetch: [1, 2]}\n", "graph.prefetch", "8", "c.yaml");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("c.yaml:1:19: graph.prefetch: expected a scalar"),
              std::string::npos)
        << e.what();
  }
}

// graph.logical_replicas in one process: every replica here, on the listed
// devices in turn, a thread each at least; refused where it is not built.
TEST_F(ConfigTest, LogicalReplicasAreThisProcessesShareOnItsDevicesInTurn) {
  RunConfig c = LoadRunConfig(
      Write(kGood), {"graph.logical_replicas=3", "graph.devices=[cpu:0, cpu:1]", "threads=2"});
  EXPECT_EQ(c.logical_replicas, 3);
  EXPECT_EQ(c.logical_first, 0);
  ASSERT_EQ(c.devices.size(), 3u);
  EXPECT_EQ(c.devices[2].ToString(), "cpu:0");
  EXPECT_EQ(c.threads, 3);
  EXPECT_EQ(LoadRunConfig(Write(kGood)).logical_replicas, 0);
  EXPECT_NE(ErrorOf(kGood, {"graph.logical_replicas=-1"}).find("graph.logical_replicas"),
            std::string::npos);
  EXPECT_NE(ErrorOf(kGood, {"graph.logical_replicas=2", "graph.devices=[cuda:0]"})
                .find("CPU devices only"),
            std::string::npos);
  EXPECT_NE(ErrorOf(kGood, {"graph.logical_replicas=2", "graph.devices=[cpu:0, cpu:1]",
                            "graph.tensor_parallel={size: 2, layers: {fc1: column}}"})
                .find("graph.tensor_parallel"),
            std::string::npos);
}

// GPU runs: no CPU/GPU mixes; one GPU may be listed several times (a
// replica per listing) only when it is the only GPU listed; the modes not
// built for GPUs yet refused up front with the key that asks for them.
TEST_F(ConfigTest, GpuDeviceListsAreCheckedBeforeTheRun) {
  RunConfig c = LoadRunConfig(Write(kGood), {"graph.devices=[cuda:0]"});
  ASSERT_EQ(c.devices.size(), 1u);
  EXPECT_TRUE(c.devices[0].is_cuda());
  EXPECT_EQ(LoadRunConfig(Write(kGood), {"graph.devices=[cuda:0, cuda:1]"}).devices.size(), 2u);
  const RunConfig twice = LoadRunConfig(Write(kGood), {"graph.devices=[cuda:1, cuda:1]"});
  ASSERT_EQ(twice.devices.size(), 2u);
  EXPECT_EQ(twice.devices[0], twice.devices[1]);
  EXPECT_EQ(LoadRunConfig(Write(kGood), {"graph.devices=[cuda:0, cuda:0, cuda:0]"}).devices.size(),
            3u);
  testing::ExpectContains(ErrorOf(kGood, {"graph.devices=[cuda:0, cuda:0, cuda:1]"}),
                          {"cuda:0 is listed twice", "the only GPU listed"});
  EXPECT_NE(ErrorOf(kGood, {"graph.devices=[cpu:0, cpu:0]"}).find("cpu:0 is listed twice"),
            std::string::npos);
  EXPECT_NE(ErrorOf(kGood, {"graph.devices=[cpu:0, cuda:0]"}).find("either CPUs or GPUs"),
            std::string::npos);
  EXPECT_TRUE(LoadRunConfig(Write(kGood), {"graph.devices=[cuda:0, cuda:0]", "graph.sync_bn=true"})
                  .data_parallel.sync_bn);
  EXPECT_EQ(LoadRunConfig(Write(kGood), {"graph.devices=[cuda:0]", "graph.precision=bf16"})
                .data_parallel.compute,
            DType::kBF16);
  EXPECT_NE(ErrorOf(kGood, {"graph.precision=fp16"}).find("CPU devices take fp32 or bf16"),
            std::string::npos);
  // bf16 on CPU devices: taken where the CPU has native bf16, else refused
  // naming what is missing (ops/cpu/onednn.h).
  if (cpu::NoNativeBf16Reason().empty()) {
    EXPECT_EQ(LoadRunConfig(Write(kGood), {"graph.precision=bf16"}).data_parallel.compute,
              DType::kBF16);
  } else {
    testing::ExpectContains(ErrorOf(kGood, {"graph.precision=bf16"}),
                            {"graph.precision", "bf16 on CPU devices", "avx512_bf16", "emulated"});
  }
  EXPECT_NE(ErrorOf(kGood, {"graph.devices=[cuda:0]", "graph.precision=f16"})
                .find("expected fp32, bf16 or fp16"),
            std::string::npos);
}

// A pipeline on GPUs: the CPU config with graph.devices changed, one GPU
// holding both stages (a lane each); fp16, whose loss scaler is the
// replicas', refused with the key and what to use instead.
TEST_F(ConfigTest, PipelinesRunOnGpusListedOnceOrMore) {
  const char* pipeline = "configs/fashion_mnist_pipeline.yaml";
  for (const char* devices : {"graph.devices=[cuda:0, cuda:0]", "graph.devices=[cuda:0, cuda:1]"}) {
    const RunConfig c = LoadRunConfig(pipeline, {devices});
    EXPECT_TRUE(c.pipeline) << devices;
    ASSERT_EQ(c.devices.size(), 2u);
    EXPECT_TRUE(c.devices[1].is_cuda());
  }
  EXPECT_EQ(LoadRunConfig(pipeline, {"graph.devices=[cuda:0, cuda:0]", "graph.precision=bf16"})
                .data_parallel.compute,
            DType::kBF16);
  std::ifstream in(pipeline);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  testing::ExpectContains(ErrorOf(text, {"graph.devices=[cuda:0, cuda:0]", "graph.precision=fp16"}),
                          {"graph.precision", "fp16 does not combine with graph.pipeline", "bf16"});
}

// Tensor parallelism on GPUs: its members lanes of one GPU or GPUs of their
// own, in f32 (the split layers compute in f32), bf16 refused saying so.
TEST_F(ConfigTest, TensorParallelRunsOnGpusInFp32) {
  const std::string tp = "graph.tensor_parallel={size: 2, layers: {fc1: column}}";
  for (const char* devices : {"graph.devices=[cuda:0, cuda:0]", "graph.devices=[cuda:0, cuda:1]"})
    EXPECT_EQ(LoadRunConfig(Write(kGood), {devices, tp}).data_parallel.tensor_parallel, 2);
  testing::ExpectContains(
      ErrorOf(kGood, {"graph.devices=[cuda:0, cuda:0]", tp, "graph.precision=bf16"}),
      {"graph.precision", "graph.tensor_parallel on GPUs", "use fp32"});
}

// graph.flush_denormals: on unless told (Training.FlushDenormalsZeroesWhatUnderflows
// checks what it does); a non-boolean is an error naming it.
TEST_F(ConfigTest, FlushDenormalsIsOnByDefault) {
  EXPECT_TRUE(LoadRunConfig(Write(kGood)).data_parallel.flush_denormals);
  EXPECT_FALSE(
      LoadRunConfig(Write(kGood), {"graph.flush_denormals=false"}).data_parallel.flush_denormals);
  testing::ExpectContains(ErrorOf(kGood, {"graph.flush_denormals=sometimes"}),
                          {"flush_denormals", "sometimes"});
}

// graph.tf32 (default true, as torch.backends.cudnn.allow_tf32) and
// graph.deterministic (default false), on GPUs and CPUs alike (a CPU run is
// deterministic and never TF32 already); a non-boolean is an error naming
// the key and the value (issue 55).
TEST_F(ConfigTest, Tf32AndDeterministicAreBooleans) {
  const GpuMathOptions def = LoadRunConfig(Write(kGood)).data_parallel.gpu_math;
  EXPECT_TRUE(def.tf32);
  EXPECT_FALSE(def.deterministic);
  for (const char* devices : {"graph.devices=[cpu:0]", "graph.devices=[cuda:0]"}) {
    SCOPED_TRACE(devices);
    const GpuMathOptions set =
        LoadRunConfig(Write(kGood), {devices, "graph.tf32=false", "graph.deterministic=true"})
            .data_parallel.gpu_math;
    EXPECT_FALSE(set.tf32);
    EXPECT_TRUE(set.deterministic);
  }
  testing::ExpectContains(ErrorOf(kGood, {"graph.tf32=maybe"}), {"tf32", "maybe"});
  testing::ExpectContains(ErrorOf(kGood, {"graph.deterministic=[true]"}), {"deterministic"});
  testing::ExpectContains(ErrorOf(kGood, {"graph.determinstic=true"}),
                          {"determinstic", "did you mean 'deterministic'"});
}

// data.device_resident (issue 59): off unless told; validates on cuda
// devices, and on CPU devices too, where it does nothing (the same config
// runs on either by changing graph.devices); a non-boolean is an error
// naming the key and the value.
TEST_F(ConfigTest, DeviceResidentIsABooleanOnGpusAndCpus) {
  EXPECT_FALSE(LoadRunConfig(Write(kGood)).device_resident);
  for (const char* devices :
       {"graph.devices=[cuda:0]", "graph.devices=[cuda:0, cuda:1]", "graph.devices=[cpu:0]"}) {
    SCOPED_TRACE(devices);
    EXPECT_TRUE(
        LoadRunConfig(Write(kGood), {devices, "data.device_resident=true"}).device_resident);
    EXPECT_FALSE(
        LoadRunConfig(Write(kGood), {devices, "data.device_resident=false"}).device_resident);
  }
  testing::ExpectContains(ErrorOf(kGood, {"graph.devices=[cuda:0]", "data.device_resident=gpu"}),
                          {"device_resident", "gpu"});
  testing::ExpectContains(ErrorOf(kGood, {"data.device_resident=[true]"}), {"device_resident"});
  testing::ExpectContains(ErrorOf(kGood, {"data.device_resdent=true"}),
                          {"device_resdent", "did you mean 'device_resident'"});
}

// Mixed labels (mixup, cutmix) train on GPUs: their graphs validate on
// cuda:0 by changing graph.devices alone (issue 55).
TEST_F(ConfigTest, MixupAndCutmixValidateOnAGpu) {
  for (const char* stage : {"mixup", "cutmix"}) {
    SCOPED_TRACE(stage);
    std::string t = testing::ReadBytes("graphs/data_parallel_mixup_ema.yaml");
    t = Replace(t, "{stage: mixup, alpha: 0.2}", StrCat("{stage: ", stage, ", alpha: 0.5}"));
    const std::string tmpl = Write(t, StrCat(stage, ".yaml"));
    const RunConfig c =
        LoadRunConfig(Write(kGood), {"graph.devices=[cuda:0]", "graph.template=" + tmpl});
    ASSERT_NE(c.train_graph.Find("mix"), nullptr);
    EXPECT_EQ(c.train_graph.Find("mix")->stage, stage);
    EXPECT_TRUE(c.devices[0].is_cuda());
  }
}

// graph.channels_last: auto (the default), true or false; true only where
// the model is data-parallel replicas (not a pipeline), and on GPUs where
// every layer on 4-D activations has a channels-last kernel (checked on the
// host: no GPU needed).
TEST_F(ConfigTest, ChannelsLastIsAutoTrueOrFalse) {
  EXPECT_EQ(LoadRunConfig(Write(kGood)).data_parallel.memory_format, MemoryFormat::kAuto);
  EXPECT_EQ(LoadRunConfig(Write(kGood), {"graph.channels_last=true"}).data_parallel.memory_format,
            MemoryFormat::kChannelsLast);
  EXPECT_EQ(LoadRunConfig(Write(kGood), {"graph.channels_last=false"}).data_parallel.memory_format,
            MemoryFormat::kNchw);
  testing::ExpectContains(ErrorOf(kGood, {"graph.channels_last=nhwc"}),
                          {"channels_last", "'nhwc'", "auto, true, false"});
#if defined(CNNFLOW_WITH_CUDA)
  EXPECT_EQ(LoadRunConfig(Write(kGood), {"graph.channels_last=true", "graph.devices=[cuda:0]"})
                .data_parallel.memory_format,
            MemoryFormat::kChannelsLast);
  const std::string upsampled = Replace(kGood, "    - {name: pool1, maxpool2d: {kernel: 2}}\n",
                                        "    - {name: up, upsample: {scale: 2}}\n"
                                        "    - {name: pool1, maxpool2d: {kernel: 4}}\n");
  testing::ExpectContains(
      ErrorOf(upsampled, {"graph.channels_last=true", "graph.devices=[cuda:0]"}),
      {"graph.channels_last", "cuda:0", "'up' (upsample)", "channels-last GPU kernel",
       "graph.channels_last: false"});
  EXPECT_EQ(LoadRunConfig(Write(upsampled), {"graph.devices=[cuda:0]"}).data_parallel.memory_format,
            MemoryFormat::kAuto);
#endif
  testing::ExpectContains(
      ErrorOf(kGood, {"graph.channels_last=true", "graph.devices=[cpu:0, cpu:1]",
                      "graph.pipeline={stages: auto}"}),
      {"graph.channels_last", "graph.pipeline"});
}

// Without a usable GPU (here; or a build without CUDA) a GPU model is a
// clear error naming the device, not a crash inside CUDA.
TEST_F(ConfigTest, WithoutAGpuAGpuModelIsAnErrorNamingTheDevice) {
  if (CudaAvailable()) GTEST_SKIP() << "a GPU is present: the error case cannot happen";
  RunConfig c = LoadRunConfig(Write(kGood), {"graph.devices=[cuda:0]"});
  try {
    Model::Build(c.layers, c.input_shape, {.seed = 1, .device = Device::Cuda(0)});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
}

TEST_F(ConfigTest, ParamGroupsAreReadInOrderAndTheirErrorsSayWhere) {
  const std::string groups =
      "  optimizer: {sgd: {lr: 0.1}}\n"
      "  param_groups:\n"
      "    - {layers: [conv2d], params: [\"*.bias\"], weight_decay: 0}\n"
      "    - {params: [\"fc1.*\"], lr_scale: 4}\n";
  RunConfig c = LoadRunConfig(Write(Replace(kGood, "  optimizer: {sgd: {lr: 0.1}}\n", groups)));
  ASSERT_EQ(c.optimizer.groups.size(), 2u);
  EXPECT_EQ(c.optimizer.groups[0].layer_types, std::vector<std::string>{"conv2d"});
  EXPECT_EQ(c.optimizer.groups[0].params, std::vector<std::string>{"*.bias"});
  ASSERT_TRUE(c.optimizer.groups[0].weight_decay.has_value());
  EXPECT_EQ(*c.optimizer.groups[0].weight_decay, 0.0);
  EXPECT_FALSE(c.optimizer.groups[1].weight_decay.has_value());  // the optimizer's
  EXPECT_EQ(c.optimizer.groups[1].lr_scale, 4.0);
  testing::ExpectContains(c.optimizer.groups[1].where, {"cfg.yaml:17:7: train.param_groups[1]"});

  const auto with = [&](const std::string& list) {
    return ErrorOf(Replace(kGood, "  optimizer: {sgd: {lr: 0.1}}\n",
                           "  optimizer: {sgd: {lr: 0.1}}\n  param_groups: " + list + "\n"));
  };
  testing::ExpectContains(with("{layers: [batchnorm]}"), {"train.param_groups: expected a list"});
  testing::ExpectContains(with("[{lr_scale: 2}]"),
                          {":15:18: train.param_groups[0]: needs params", "or layers"});
  testing::ExpectContains(with("[{layers: [batchnrom]}]"),
                          {"unknown layer type 'batchnrom' (did you mean 'batchnorm'?)"});
  testing::ExpectContains(with("[{params: [a], lr_scael: 2}]"),
                          {"train.param_groups[0]", "unknown key 'lr_scael'", "lr_scale"});
}

// graph.startup_timeout_s: unset, the longer of 10 minutes and
// collective_timeout_s; set, as given (shorter too); never <= 0.
TEST_F(ConfigTest, StartupTimeoutDefaultsToTenMinutesOrTheCollectiveTimeout) {
  EXPECT_EQ(LoadRunConfig(Write(kGood)).startup_timeout_s, 600);
  EXPECT_EQ(LoadRunConfig(Write(kGood), {"graph.collective_timeout_s=10"}).startup_timeout_s, 600);
  EXPECT_EQ(LoadRunConfig(Write(kGood), {"graph.collective_timeout_s=900"}).startup_timeout_s, 900);
  const RunConfig c =
      LoadRunConfig(Write(kGood), {"graph.collective_timeout_s=10", "graph.startup_timeout_s=30"});
  EXPECT_EQ(c.data_parallel.timeout_s, 10);
  EXPECT_EQ(c.startup_timeout_s, 30);
  EXPECT_EQ(LoadRunConfig(Write(kGood), {"graph.startup_timeout_s=4"}).startup_timeout_s, 4);
  for (const char* bad : {"graph.startup_timeout_s=0", "graph.startup_timeout_s=-5"}) {
    testing::ExpectContains(ErrorOf(kGood, {bad}), {"graph.startup_timeout_s", "must be > 0"});
  }
  testing::ExpectContains(ErrorOf(kGood, {"graph.startup_timeout=30"}),
                          {"startup_timeout", "did you mean", "startup_timeout_s"});
}

TEST_F(ConfigTest, EpochsMayHaveAFraction) {
  EXPECT_EQ(LoadRunConfig(Write(kGood), {"train.epochs=9.9"}).epochs, 9.9);
  testing::ExpectContains(ErrorOf(kGood, {"train.epochs=0"}), {"train.epochs", "must be > 0"});
}

}  // namespace
}  // namespace cnnflow
