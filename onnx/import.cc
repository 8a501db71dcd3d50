#include "onnx/import.h"

#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <climits>
#include <filesystem>
#include <sstream>

#include "onnx/importer.h"
#include "ops/error.h"
#include "ops/io/file_write.h"
#include "ops/io/safetensors.h"
#include "pipeline/model_blocks.h"
#include "pipeline/run_config.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

std::string Floats(const std::vector<double>& v) {
  std::string s;
  for (double d : v) s += StrCat(s.empty() ? "" : ", ", ParamValueToString(ParamValue(d)));
  return "[" + s + "]";
}

}  // namespace

ImportedOnnx ImportOnnx(const void* bytes, size_t size, const std::string& what) {
  if (size > static_cast<size_t>(INT_MAX)) {
    throw Error(StrCat(what, ": ", size,
                       " bytes; protobuf reads ONNX files up to 2 GiB (larger "
                       "models keep their weights in external files, which the "
                       "importer does not read)"));
  }
  onnx::ModelProto proto;
  if (!proto.ParseFromArray(bytes, static_cast<int>(size))) {
    throw Error(StrCat(what,
                       ": not an ONNX model (its protobuf does not parse: a truncated file, or "
                       "another kind of file)"));
  }
  if (!proto.has_graph() || proto.graph().node_size() == 0) {
    throw Error(StrCat(what, ": not an ONNX model, or one without a graph (no nodes)"));
  }
  ImportedOnnx m = onnx_io::OnnxImporter(proto, what).Run();
  if (m.name.empty() || !onnx_io::IsModulePath(m.name)) m.name = "imported";
  return m;
}

std::string ImportedConfig(const ImportedOnnx& m, const std::string& onnx_path,
                           const std::vector<double>& mean, const std::vector<double>& std) {
  const std::string shape = m.input_shape.ToString();
  std::ostringstream y;
  y << "# Imported by `cnnflow import` from " << fs::path(onnx_path).filename().string() << " ("
    << m.source << "): " << m.onnx_nodes << " ONNX nodes, " << m.layers.size() << " layers.\n"
    << "# The weights are model.safetensors beside this file (train.init reads them):\n"
    << "#   cnnflow predict model.yaml --weights model.safetensors IMAGE.jpg\n"
    << "# (predict decodes as data.test does: a centre crop of the input's size; an\n"
    << "# ImageNet network wants its images resized first: resize_min_side: 256 in a\n"
    << "# folder or lmdb source)\n"
    << "# Before training, replace:\n"
    << "#   - data: a synthetic placeholder of the input's shape; your data set's source\n"
    << "#     (cnnflow stages lists them) and its augmentation;\n"
    << (mean.empty() ? "#   - add the normalisation the network was trained with:\n"
                       "#     transform: [{normalize: {mean: [...], std: [...]}}] under data;\n"
                     : "")
    << "#   - train: epochs, batch, optimizer and schedule; graph: devices.\n";
  for (const std::string& note : m.notes) y << "# Note: " << note << "\n";
  y << "name: " << m.name << "\n"
    << "seed: 0\n"
    << "data:\n"
    << "  train: {source: synthetic, shape: " << shape << ", classes: " << m.classes
    << ", size: 1024}\n"
    << "  test: {source: synthetic, shape: " << shape << ", classes: " << m.classes
    << ", size: 256, seed: 1}\n";
  if (!mean.empty())
    y << "  transform: [{normalize: {mean: " << Floats(mean) << ", std: " << Floats(std) << "}}]\n";
  y << "model:\n"
    << "  input: " << shape << "\n"
    << "  layers:\n";
  for (const LayerSpec& s : m.layers) y << "    " << LayerSpecLine(s) << "\n";
  y << "train:\n"
    << "  epochs: 1\n"
    << "  batch: 32\n"
    << "  optimizer: {sgd: {lr: 0.01, momentum: 0.9, weight_decay: 0.0001}}\n"
    << "  init: {weights: model.safetensors}\n";
  return y.str();
}

void WriteImported(const ImportedOnnx& m, const std::string& config, const std::string& dir) {
  const fs::path out = fs::absolute(dir).lexically_normal();
  if (fs::exists(out) && !(fs::is_directory(out) && fs::is_empty(out))) {
    throw Error(
        StrCat(dir, ": exists and is not an empty folder; cnnflow import writes a new one"));
  }
  fs::create_directories(out.parent_path());
  const fs::path tmp =
      out.parent_path() / StrCat(".", out.filename().string(), ".tmp.", ::getpid());
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  try {
    WriteFileAtomically((tmp / "model.yaml").string(), config);
    SaveSafetensors((tmp / "model.safetensors").string(), m.tensors,
                    {{"format", "pt"}, {"cnnflow", "import"}});
    const RunConfig rc = LoadRunConfig((tmp / "model.yaml").string());
    auto model = Model::Build(rc.layers, rc.input_shape);
    LoadStateDict(LoadSafetensors((tmp / "model.safetensors").string()).tensors, {model.get()}, {},
                  (tmp / "model.safetensors").string());
    if (fs::exists(out)) fs::remove(out);  // empty
    fs::rename(tmp, out);
    FsyncDir(out.parent_path().string());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace cnnflow
