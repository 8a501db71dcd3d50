#!/usr/bin/env bash
# The main job on a fresh machine: set up, build, train the default config
# (the two-layer CNN on Fashion-MNIST). Extra arguments go to `cnnflow train`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec build/cnnflow train configs/fashion_mnist.yaml "$@"
