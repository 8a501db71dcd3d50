#!/usr/bin/env bash
# Configures and builds cnnflow in build/ (Release). CUDA is on when nvcc is
# found; pass -DCNNFLOW_WITH_CUDA=OFF (or any CMake option) to change that.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build
