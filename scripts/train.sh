#!/usr/bin/env bash
# The main job on a fresh machine: set up, build, train the default config
# (the two-layer CNN on Fashion-MNIST). Extra arguments go to `cnnflow train`.
# It installs and builds only what that needs: the cnnflow binary, not the
# tests, benchmarks or fuzzers (scripts/test.sh adds those).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh run
scripts/build.sh --target cnnflow -DCNNFLOW_BUILD_TESTS=OFF -DCNNFLOW_BUILD_BENCH=OFF
exec build/cnnflow train configs/fashion_mnist.yaml "$@"
