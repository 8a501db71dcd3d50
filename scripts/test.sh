#!/usr/bin/env bash
# The whole test suite on a fresh machine: set up, build, run ctest, then the
# fuzz smoke.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# PyPI packages for the tests that read files back with the field's readers
# (TensorBoard, onnxruntime); without them those tests skip.
scripts/setup_python.sh || echo "test.sh: no Python packages from PyPI; the TensorBoard and ONNX tests will skip"
# The tests and benchmarks on, whatever an earlier scripts/train.sh configured;
# position-independent code, so that the Python package's build (ctest
# python.pytest) gets these objects from ccache instead of compiling them again.
scripts/build.sh -DCNNFLOW_BUILD_TESTS=ON -DCNNFLOW_BUILD_BENCH=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON
(cd build && ctest --output-on-failure -j2 --timeout 600)
# Fuzz smoke (fuzz/, docs/testing.md "Fuzzing"): each parser target 10 s under ASan +
# UBSan, a finding fails the run. The two config targets and onnx_import need
# a sanitized build of the whole project, so CI replays only their seeds and crash inputs
# (ctest fuzz_regression_test); CNNFLOW_FUZZ_TARGETS="$(ls fuzz/corpus)" runs them too.
if command -v clang++-14 >/dev/null; then
  FUZZ_NICE=0 scripts/fuzz.sh "${CNNFLOW_FUZZ_SECONDS:-10}" \
    ${CNNFLOW_FUZZ_TARGETS:-$(ls fuzz/corpus | grep -vx -e run_config -e graph_template -e onnx_import)}
else
  echo "test: clang++-14 not found, fuzz smoke skipped"
fi
