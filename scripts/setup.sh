#!/usr/bin/env bash
# Installs the Debian packages cnnflow needs. Safe to run twice: apt-get
# skips what is installed, and the package lists are refreshed only when a
# package is missing.
#
#   scripts/setup.sh run   what building the cnnflow binary and running its
#                          main job need (scripts/train.sh)
#   scripts/setup.sh       that, and what the tests, the fuzzers and the
#                          tools the tests call need (scripts/test.sh)
set -euo pipefail

# Build and run: the compiler, the libraries the cnnflow target links, the
# default data set.
packages=(
  build-essential cmake ninja-build pkg-config ccache
  libtbb-dev libyaml-cpp-dev zlib1g-dev libopenblas-dev
  liblmdb-dev libturbojpeg0-dev libpng-dev libopencv-dev
  libdnnl-dev ocl-icd-opencl-dev opencl-c-headers
  libopenmpi-dev openmpi-bin
  libcairo2-dev fonts-dejavu-core  # cnnflow plot, bench --plot (PNG, SVG)
  libonnx-dev libprotobuf-dev      # cnnflow export and import (ONNX)
  dataset-fashion-mnist
)
if [[ "${1:-all}" != run ]]; then
  packages+=(
    libgtest-dev libgmock-dev libbenchmark-dev  # the tests and bench/
    lmdb-utils
    clang-format-14  # scripts/format.sh --check (ctest cli.format)
    universal-ctags  # ctest cli.house: function lengths
    graphviz  # cnnflow graph -o FILE.svg
    iproute2 nftables iputils-ping  # the multi-host tests: namespaces, shaping, packet loss, reachability (tests/cli/netns_*.sh)
    curl ca-certificates python3  # scripts/prepare_*.sh downloads; tests/cli/prepare_test.sh
    # scripts/fuzz.sh: libFuzzer and the sanitizer runtimes, OpenMP for clang,
    # llvm-symbolizer for readable stacks.
    clang-14 libclang-rt-14-dev libomp-14-dev llvm-14
  )
fi
# For bench/: PyTorch on the CPU, side by side with cnnflow, on tcmalloc, its
# best allocator (bench/torch_malloc.sh).
if [[ "${CNNFLOW_SETUP_BENCH:-0}" == 1 ]]; then
  packages+=(python3-torch python3-numpy python3-pil python3-lmdb plasma-workspace-wallpapers
             libgoogle-perftools4)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
