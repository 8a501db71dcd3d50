#!/usr/bin/env bash
# Builds the GPU binaries for the lent GPU machine (../shared/DEVICE.md) and
# packs them, with the shared libraries that machine lacks (everything but
# glibc, libstdc++/libgcc and the CUDA driver), into build-device/bundle.tar.xz.
# cuDNN, cuBLAS and NCCL are too big to carry (cuDNN 9 alone is ~800 MB):
# device_check.sh finds the copies the machine's PyTorch ships instead
# (cuBLAS is loaded at run time, 13 or 12: ops/cuda/cublas_api.h).
# Then: run (device tool) `bash scripts/device_check.sh` with
# carry: ["build-device/bundle.tar.xz"].
#   scripts/device_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-device
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCNNFLOW_WITH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCNNFLOW_BUILD_BENCH=ON -DCNNFLOW_NATIVE=OFF > /dev/null
ninja -C "$build" cnnflow ops_test pipeline_test tensor_parallel_bench
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
cp "$build/cnnflow" "$build/tests/ops_test" "$build/tests/pipeline_test" \
  "$build/bench/tensor_parallel_bench" "$stage/bin/"
# Libraries the GPU machine does not have: keep what is not the C runtime,
# the C++ runtime, the driver (libcuda) or one of the big CUDA libraries.
for bin in "$stage"/bin/*; do
  ldd "$bin" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
    libcuda.so*|libcublas*|libcudnn*|libnccl*|libnvrtc*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
raw=$(du -sm "$stage" | cut -f1)
tar -C "$stage" -cJf "$build/bundle.tar.xz" bin lib
echo "bundle: $build/bundle.tar.xz ($(du -h "$build/bundle.tar.xz" | cut -f1), ${raw} MB unpacked," \
     "$(ls "$stage/lib" | wc -l) libraries)"
