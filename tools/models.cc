#include "tools/models.h"

#include <cstdio>
#include <filesystem>
#include <set>

#include "ops/io/safetensors.h"
#include "ops/io/weights_file.h"
#include "ops/loss.h"
#include "ops/model.h"
#include "pipeline/model_blocks.h"
#include "pipeline/run_config.h"
#include "tools/command_line.h"

namespace cnnflow {
namespace {

// --check: the network with `weights` (strict: every tensor of the model and
// of the file, by PyTorch's names) on `input`'s "input" [N, ...]: the logits
// in evaluation mode ("logits"), and in training mode ("logits_train") with
// the gradients of the mean cross-entropy on "labels" ("grad.<tensor>"):
// what bench/library_vs_pytorch.py compares with PyTorch. In `dtype` (f64:
// every kernel's reference path, to compare with PyTorch in float64), the
// outputs too.
void Check(const ExpandedModel& m, const std::string& weights, const std::string& input,
           const std::string& out, DType dtype) {
  auto model = Model::Build(m.layers, m.input_shape, {.dtype = dtype});
  LoadStateDict(LoadWeightsFile(weights).tensors, {model.get()}, {}, weights);
  const SafetensorsFile in = LoadSafetensors(input);
  const Tensor* x = in.Find("input");
  const Tensor* y = in.Find("labels");
  if (x == nullptr || y == nullptr)
    throw Error(StrCat(input, ": needs tensors 'input' and 'labels'"));
  const Tensor xf = x->Cast(dtype);
  std::vector<int64_t> labels(y->numel());
  for (int64_t i = 0; i < y->numel(); ++i) labels[i] = static_cast<int64_t>(y->At(i));
  std::vector<std::pair<std::string, Tensor>> result;
  ForwardContext eval;
  eval.training = false;
  eval.keep_activations = false;
  result.emplace_back("logits", model->Forward(xf, eval).Clone());
  ForwardContext train;
  const Tensor logits = model->Forward(xf, train).Clone();
  Tensor dlogits = Tensor::Empty(logits.shape(), logits.dtype());
  const LossResult loss = SoftmaxCrossEntropy(logits, labels.data(), &dlogits);
  model->ZeroGrad();
  model->Backward(dlogits);
  result.emplace_back("logits_train", logits);
  result.emplace_back("loss", Tensor::Full(Shape{1}, loss.loss, dtype));
  for (const auto& np : model->NamedParameters())
    result.emplace_back("grad." + np.name, np.param->grad);
  SaveSafetensors(out, result);
}

// A library network by NAME, or the model section of a config file (an
// imported model's model.yaml), with --set overrides.
ExpandedModel ModelOf(const std::string& name, const std::vector<std::string>& overrides) {
  if (std::filesystem::is_regular_file(name)) {
    const RunConfig rc = LoadRunConfig(name, overrides);
    return ExpandedModel{rc.layers, rc.input_shape};
  }
  return ExpandLibraryModel(name, overrides);
}

}  // namespace

int RunModels(const std::vector<std::string>& args) {
  std::string name, weights, check, out;
  DType dtype = DType::kF32;
  std::vector<std::string> overrides;
  try {
    CommandLine cmd(args);
    while (cmd.Next()) {
      if (cmd.Is("-h", "--help")) return std::printf("%s", kModelsUsage), 0;
      if (cmd.Is("--weights")) {
        weights = cmd.Value();
      } else if (cmd.Is("--check")) {
        check = cmd.Value();
      } else if (cmd.Is("--f64")) {
        dtype = DType::kF64;
      } else if (cmd.Is("-o")) {
        out = cmd.Value();
      } else if (cmd.Is("--set")) {
        overrides.push_back(cmd.Value());
      } else if (!cmd.IsOption() && name.empty()) {
        name = cmd.arg();
      } else {
        cmd.Reject();
      }
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "cnnflow models: %s\n\n%s", e.what(), kModelsUsage);
    return 2;
  }
  if (!check.empty() && (name.empty() || weights.empty() || out.empty())) {
    std::fprintf(stderr, "cnnflow models: --check needs NAME, --weights FILE and -o OUT\n\n%s",
                 kModelsUsage);
    return 2;
  }
  try {
    if (!check.empty()) {
      Check(ModelOf(name, overrides), weights, check, out, dtype);
      return 0;
    }
    if (!name.empty()) {
      const ExpandedModel m = ModelOf(name, overrides);
      auto model = Model::Build(m.layers, m.input_shape);
      std::printf(
          "# %s: %zu layers, %.2f M parameters, %.3f GFLOPs per sample\nmodel:\n  input: %s\n  "
          "layers:\n",
          name.c_str(), m.layers.size(), model->NumParameters() / 1e6, model->ForwardFlops(1) / 1e9,
          m.input_shape.ToString().c_str());
      for (const LayerSpec& s : m.layers) std::printf("    %s\n", LayerSpecLine(s).c_str());
      return 0;
    }
    std::printf("%-18s %-14s %9s %9s  %s\n", "name", "input", "params M", "GFLOPs", "options");
    for (const LibraryModel& lm : LibraryModels()) {
      const ExpandedModel m = ExpandLibraryModel(lm.name, overrides);
      auto model = Model::Build(m.layers, m.input_shape);
      std::string opts;
      for (const auto& [k, v] : lm.options) opts += StrCat(opts.empty() ? "" : ", ", k, ": ", v);
      std::printf("%-18s %-14s %9.2f %9.3f  %s\n", lm.name.c_str(),
                  m.input_shape.ToString().c_str(), model->NumParameters() / 1e6,
                  model->ForwardFlops(1) / 1e9, lm.doc.c_str());
      std::printf("%-18s   {%s}\n", "", opts.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cnnflow models: %s\n", e.what());
    return 1;
  }
}

}  // namespace cnnflow
