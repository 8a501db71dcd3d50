// The table of fuzz entries (fuzz_targets.h), for the regression test.
#include "fuzz/fuzz_targets.h"

namespace cnnflow::fuzz {

const std::vector<FuzzTarget>& FuzzTargets() {
  static const std::vector<FuzzTarget> targets = {
      {"idx", FuzzIdx, "IdxDataset::Open + Read (loaders/idx_dataset.h)"},
      {"cnnflow_record", FuzzCnnflowRecord, "DecodeCnnflowRecord (loaders/record.h)"},
      {"caffe_datum", FuzzCaffeDatum, "DecodeCaffeDatum (loaders/record.h)"},
      {"image", FuzzImage,
       "ReadImageHeader, DecodeImage, ImageSampleDecoder (loaders/image_decoder.h)"},
      {"ts", FuzzTs, "ParseTs (loaders/ts_format.h)"},
      {"wav", FuzzWav, "DecodeWav (loaders/wav.h)"},
      {"run_config", FuzzRunConfig, "LoadRunConfig of a config file (pipeline/run_config.h)"},
      {"graph_template", FuzzGraphTemplate, "LoadRunConfig with the input as graph.template"},
      {"safetensors", FuzzSafetensors, "LoadSafetensors (ops/io/safetensors.h)"},
      {"pth", FuzzPth, "LoadPth (ops/io/pth.h)"},
      {"checkpoint_sidecar", FuzzCheckpointSidecar, "LoadCheckpoint (pipeline/checkpoint.h)"},
      {"json", FuzzJson, "ParseJson + WriteJson (ops/io/json.h)"},
      {"onnx_import", FuzzOnnxImport, "ImportOnnx + Model::Build + LoadStateDict (onnx/import.h)"},
  };
  return targets;
}

const FuzzTarget* FindFuzzTarget(const std::string& name) {
  for (const FuzzTarget& t : FuzzTargets()) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

}  // namespace cnnflow::fuzz
