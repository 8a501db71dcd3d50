#!/usr/bin/env bash
# Runs on the lent GPU machine (../shared/DEVICE.md), from the repository
# root, with build-device/bundle.tar.xz carried over (scripts/device_bundle.sh).
# Unpacks the bundle, shows the GPU, runs the GPU tests, and writes every log
# to $OUT (the device tool's output folder). Finishes in a few minutes.
#   bash scripts/device_check.sh
set -uo pipefail
out="${OUT:-/tmp/device-check}"
mkdir -p "$out"
dir=$(mktemp -d)
tar -C "$dir" -xJf build-device/bundle.tar.xz
# cuDNN, cuBLAS, NCCL: the copies that the machine's PyTorch wheels ship.
nvidia_libs=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib")))))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$dir/lib:${nvidia_libs}:${LD_LIBRARY_PATH:-}"
{
  date -u
  nvidia-smi -L || echo "no nvidia-smi"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
} 2>&1 | tee "$out/gpu.txt"
# Missing libraries show here first.
ldd "$dir/bin/ops_test" | grep "not found" | tee "$out/missing-libs.txt"
timeout 300 "$dir/bin/ops_test" --gtest_filter='*GPU*' 2>&1 | tee "$out/gpu-tests.txt"
status=${PIPESTATUS[0]}
echo "gpu tests exit status: $status" | tee -a "$out/gpu-tests.txt"
exit "$status"
