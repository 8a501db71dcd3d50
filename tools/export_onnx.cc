// `cnnflow export`: the command line over the ONNX library's export
// (onnx/export.h): a run's (or a config's) model with its weights, and
// optionally samples with cnnflow's logits to check an ONNX runtime against.
#include "tools/export_onnx.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "onnx/export.h"
#include "ops/io/safetensors.h"
#include "ops/io/weights_file.h"
#include "ops/model.h"
#include "ops/train/weight_average.h"
#include "pipeline/run_config.h"
#include "pipeline/trainer.h"
#include "tools/command_line.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

constexpr const char* kExportUsage =
    R"(usage: cnnflow export RUN_DIR|CONFIG [--weights FILE] -o MODEL.onnx [--ema] [--set key=value ...]
                      [--check N FILE.safetensors]

  RUN_DIR             a run folder: its config.yaml, and model.safetensors unless --weights
  CONFIG --weights W  a config and the weights to export (a run's model.safetensors, or a
                      PyTorch state_dict as torch.save wrote it: .pth)
  -o MODEL.onnx       the ONNX file (opset 17; input "input" [N, ...], output "logits")
  --ema               export the weight average (the ema stage's "ema.*" tensors)
  --check N FILE      also write the first N test samples (as the model sees them,
                      normalised) and cnnflow's logits for them to FILE (safetensors:
                      "input", "logits"), to compare with an ONNX runtime
)";

// The first n test samples (train without a test set) as the model reads
// them, and the logits of `model` for them.
void WriteCheck(Trainer& trainer, int64_t n, const std::string& path) {
  const RunContext& run = trainer.context();
  const Dataset& data = run.dataset(run.datasets.count("test") ? "test" : "train");
  n = std::min(n, data.size());
  const Shape sample = data.sample_shape();
  Tensor x = Tensor::Empty(sample.WithBatch(n), DType::kF32);
  float* dst = x.data<float>();
  const ReadContext ctx{run.seed, 0, false};
  for (int64_t i = 0; i < n; ++i) {
    const ReadResult r = data.Read(i, ctx, dst + i * sample.numel());
    if (!r.ok()) throw Error(StrCat("sample ", data.Key(i), ": ", r.error));
    if (!data.normalizes()) run.transform.Apply(dst + i * sample.numel(), sample);
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
  CommandLine cmd(args);
  while (cmd.Next()) {
    if (cmd.Is("--weights")) {
      weights = cmd.Value();
    } else if (cmd.Is("-o", "--out")) {
      out = cmd.Value();
    } else if (cmd.Is("--set")) {
      sets.push_back(cmd.Value());
    } else if (cmd.Is("--ema")) {
      ema = true;
    } else if (cmd.Is("--check")) {
      check_n = cmd.Count();
      check_path = cmd.Value();
    } else if (!cmd.IsOption() && source.empty()) {
      source = cmd.arg();
    } else {
      cmd.Reject();
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
  std::unique_ptr<Model> model = Model::Build(
      rc.layers, rc.input_shape, {.seed = rc.seed, .init = rc.init, .fuse_activations = false});
  const std::string prefix = ema ? kEmaPrefix : "";
  StateDictRules rules;
  rules.prefix = prefix;
  LoadStateDict(LoadWeightsFile(weights).tensors, {model.get()}, rules, weights);

  ExportOptions options;
  options.name = rc.name;
  options.doc = StrCat("cnnflow config ", rc.name, " (", config, "), weights ", weights);
  const onnx::ModelProto proto = ExportModel(*model, options);
  WriteOnnx(proto, out);
  std::printf(
      "wrote %s: %s, %d layers -> %d ONNX nodes, %d initializers, opset %d, input [N, %s], "
      "output logits [N, %s]\n",
      out.c_str(), rc.name.c_str(), model->num_layers(), proto.graph().node_size(),
      proto.graph().initializer_size(), kOnnxOpset,
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
