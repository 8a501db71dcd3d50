// The libFuzzer driver of one fuzz entry (fuzz_targets.h), chosen at
// compile time: CNNFLOW_FUZZ_ENTRY (the function), CNNFLOW_FUZZ_TARGET (its
// name). cnnflow::Error is the expected rejection; any other exception is
// reported and aborts, so libFuzzer saves the input as a crash.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <typeinfo>

#include "fuzz/fuzz_targets.h"
#include "ops/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    cnnflow::fuzz::CNNFLOW_FUZZ_ENTRY(data, size);
  } catch (const cnnflow::Error&) {
    // A rejection with a named error: expected.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_%s: FINDING: uncaught %s: %s\n", CNNFLOW_FUZZ_TARGET,
                 typeid(e).name(), e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "fuzz_%s: FINDING: uncaught non-std exception\n", CNNFLOW_FUZZ_TARGET);
    std::abort();
  }
  return 0;
}
