#!/usr/bin/env bash
# The whole test suite on a fresh machine: set up, build, run ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd build
ctest --output-on-failure -j2 --timeout 600
