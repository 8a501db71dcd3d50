// The fuzz targets: one entry per parser of bytes that come from outside
// (data files, records, configs, checkpoints). Each entry feeds one input
// through the same function the loaders, the trainer and `cnnflow` call.
//
// Contract: an entry returns, or throws cnnflow::Error (or a subclass) for an
// input it rejects (parsers that report bad data as a value, as the record
// and image decoders do, have their message thrown as an Error). Anything
// else (another exception type, a crash, a sanitizer report, a hang, a huge
// allocation) is a finding. The libFuzzer drivers (fuzz/fuzzer.cc, one
// binary per entry) and the regression test
// (tests/fuzz/fuzz_regression_test.cc, which replays fuzz/corpus/<name>/ and
// fuzz/regressions/<name>/ with the normal compiler) both call these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cnnflow::fuzz {

using FuzzEntry = void (*)(const uint8_t* data, size_t size);

// The entries (parser_targets.cc, config_targets.cc, model_targets.cc).
void FuzzIdx(const uint8_t* data, size_t size);
void FuzzCnnflowRecord(const uint8_t* data, size_t size);
void FuzzCaffeDatum(const uint8_t* data, size_t size);
void FuzzImage(const uint8_t* data, size_t size);
void FuzzTs(const uint8_t* data, size_t size);
void FuzzWav(const uint8_t* data, size_t size);
void FuzzRunConfig(const uint8_t* data, size_t size);
void FuzzGraphTemplate(const uint8_t* data, size_t size);
void FuzzSafetensors(const uint8_t* data, size_t size);
void FuzzPth(const uint8_t* data, size_t size);
void FuzzCheckpointSidecar(const uint8_t* data, size_t size);
void FuzzJson(const uint8_t* data, size_t size);
void FuzzOnnxImport(const uint8_t* data, size_t size);

struct FuzzTarget {
  const char* name;  // fuzz/corpus/<name>/, fuzz/regressions/<name>/, build-fuzz/fuzz_<name>
  FuzzEntry entry;
  const char* what;  // one line: the entry point it drives
};

// Every target, in a fixed order.
const std::vector<FuzzTarget>& FuzzTargets();

// The target called `name`, or nullptr.
const FuzzTarget* FindFuzzTarget(const std::string& name);

}  // namespace cnnflow::fuzz
