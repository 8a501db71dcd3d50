#include "onnx/converter.h"

namespace cnnflow::onnx_io {
namespace {

template <typename T>
std::string Joined(const Registry<T>& registry, bool (*keep)(const T&)) {
  std::string s;
  for (const std::string& name : registry.Names())
    if (keep(*registry.Find(name))) s += (s.empty() ? "" : ", ") + name;
  return s;
}

}  // namespace

std::string ImportableOps() {
  return Joined<OnnxImport>(OnnxImportRegistry::Get(), [](const OnnxImport&) { return true; });
}

std::string ExportableTypes() {
  return Joined<OnnxExport>(OnnxExportRegistry::Get(),
                            [](const OnnxExport& e) { return static_cast<bool>(e.convert); });
}

}  // namespace cnnflow::onnx_io
