#!/usr/bin/env bash
# Configures and builds cnnflow in build/ (Release). CUDA is on when nvcc is
# found; pass -DCNNFLOW_WITH_CUDA=OFF (or any CMake option) to change that.
# --target T builds only T (the main job: --target cnnflow), else everything
# the options enable.
#   scripts/build.sh [--target T] [-DOPTION=VALUE ...]
set -euo pipefail
cd "$(dirname "$0")/.."
target=()
if [[ "${1:-}" == --target ]]; then
  target=(--target "${2:?--target needs a name}")
  shift 2
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build "${target[@]}"
