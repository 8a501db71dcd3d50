#!/usr/bin/env bash
# The whole test suite on a fresh machine: set up, build, run ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# PyPI packages for the tests that read files back with the field's readers
# (TensorBoard, onnxruntime); without them those tests skip.
scripts/setup_python.sh || echo "test.sh: no Python packages from PyPI; the TensorBoard and ONNX tests will skip"
scripts/build.sh
cd build
ctest --output-on-failure -j2 --timeout 600
