// `cnnflow import`: the command line over the ONNX library's import
// (onnx/import.h).
#include "tools/import_onnx.h"

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "onnx/import.h"
#include "onnx/importer.h"
#include "ops/error.h"
#include "ops/io/file_write.h"
#include "tools/command_line.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

constexpr const char* kImportUsage =
    R"(usage: cnnflow import MODEL.onnx -o DIR [--name NAME] [--mean m,m,m --std s,s,s]

  MODEL.onnx      an ONNX model of one input [N, C, H, W] or [N, C, L] and one output
                  [N, classes]; from PyTorch: torch.onnx.export(model.eval(), x, path,
                  dynamo=False, training=torch.onnx.TrainingMode.PRESERVE,
                  do_constant_folding=False) keeps BatchNormalization as nodes (trainable)
  -o DIR          a new folder: DIR/model.yaml (a run config: the network, a synthetic
                  placeholder data section, a minimal train section) and
                  DIR/model.safetensors (the weights, by PyTorch's names where ONNX has them);
                  written whole or not at all
  --name NAME     the run's name (default: the graph's, else the file's stem)
  --mean, --std   the normalisation the network was trained with, per channel
                  (ImageNet's: 0.485,0.456,0.406 and 0.229,0.224,0.225); a normalize
                  transform in model.yaml (default: none)
)";

std::vector<double> ParseFloats(const std::string& s, const char* flag) {
  std::vector<double> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    const double d = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0')
      throw UsageError(StrCat(flag, " takes numbers separated by commas, not '", s, "'"));
    v.push_back(d);
  }
  return v;
}

}  // namespace

int RunImport(const std::vector<std::string>& args) {
  std::string in, out, name;
  std::vector<double> mean, std;
  try {
    CommandLine cmd(args);
    while (cmd.Next()) {
      if (cmd.Is("-h", "--help")) return std::printf("%s", kImportUsage), 0;
      if (cmd.Is("-o")) {
        out = cmd.Value();
      } else if (cmd.Is("--name")) {
        name = cmd.Value();
      } else if (cmd.Is("--mean")) {
        mean = ParseFloats(cmd.Value(), "--mean");
      } else if (cmd.Is("--std")) {
        std = ParseFloats(cmd.Value(), "--std");
      } else if (!cmd.IsOption() && in.empty()) {
        in = cmd.arg();
      } else {
        cmd.Reject();
      }
    }
    if (in.empty() || out.empty()) throw UsageError("needs MODEL.onnx and -o DIR");
    if (mean.size() != std.size()) throw UsageError("--mean and --std need as many values each");
    if (!name.empty() && !onnx_io::IsModulePath(name))
      throw UsageError(StrCat("--name '", name, "': letters, digits, _, - and ."));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "cnnflow import: %s\n\n%s", e.what(), kImportUsage);
    return 2;
  }
  try {
    std::ifstream f(in, std::ios::binary);
    if (!f) throw Error(StrCat(in, ": cannot open: ", ErrnoText(errno)));
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ImportedOnnx m = ImportOnnx(bytes.data(), bytes.size(), in);
    if (!name.empty()) {
      m.name = name;
    } else if (m.name == "imported" || m.name == "main_graph" || m.name == "torch_jit" ||
               m.name == "main") {
      const std::string stem = fs::path(in).stem().string();
      if (onnx_io::IsModulePath(stem)) m.name = stem;
    }
    if (!mean.empty() && mean.size() != static_cast<size_t>(m.input_shape[0])) {
      throw Error(
          StrCat("--mean has ", mean.size(), " values for ", m.input_shape[0], " input channels"));
    }
    WriteImported(m, ImportedConfig(m, in, mean, std), out);
    int64_t params = 0;
    for (const auto& [n, t] : m.tensors) params += t.numel();
    std::printf(
        "imported %s (%s): %d ONNX nodes -> %zu layers, %zu tensors (%.2f M values), input %s, "
        "%lld classes\n",
        in.c_str(), m.source.c_str(), m.onnx_nodes, m.layers.size(), m.tensors.size(), params / 1e6,
        m.input_shape.ToString().c_str(), static_cast<long long>(m.classes));
    for (const std::string& note : m.notes) std::printf("note: %s\n", note.c_str());
    std::printf("wrote %s/model.yaml and %s/model.safetensors\n", out.c_str(), out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cnnflow import: %s\n", e.what());
    return 1;
  }
}

}  // namespace cnnflow
