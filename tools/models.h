// `cnnflow models [NAME] [--set option=value ...]`: the model library
// (models/*.yaml). Without NAME, every network with its parameter count,
// forward FLOPs per sample and options; with NAME, its layers written out
// flat, as a config's model.layers would hold them; with --check, its
// outputs and gradients for given weights and input (to compare with
// PyTorch). Returns the exit code.
#pragma once

#include <string>
#include <vector>

namespace cnnflow {

inline constexpr const char* kModelsUsage =
    "usage: cnnflow models [NAME|CONFIG] [--set option=value ...]\n"
    "       cnnflow models NAME|CONFIG --weights W.safetensors --check IN.safetensors -o "
    "OUT.safetensors [--f64]\n"
    "  without NAME: every library network (model: {library: NAME, with: {...}}), its\n"
    "  parameters, forward GFLOPs per sample and options; with NAME: its layers, flat;\n"
    "  CONFIG (a config file, e.g. an imported model.yaml): its model section, the same way.\n"
    "  --check: load W strictly (PyTorch state_dict names), run IN's 'input' [N, ...]:\n"
    "  'logits' (eval mode), 'logits_train', 'loss' and 'grad.<tensor>' of the mean\n"
    "  cross-entropy on IN's 'labels' (training mode) go to OUT; --f64 computes in float64\n";

int RunModels(const std::vector<std::string>& args);

}  // namespace cnnflow
