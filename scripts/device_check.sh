#!/usr/bin/env bash
# Runs on the lent GPU machine (../shared/DEVICE.md), from the repository
# root, with build-device/bundle.tar.xz carried over (scripts/device_bundle.sh);
# the rest (bench/configs/, graphs/, bench/*.py) travels with the working tree.
# Unpacks the bundle, shows the GPU, runs the GPU tests, then cnnflow vs
# PyTorch side by side (bench/gpu_vs_pytorch.sh: the two-layer Fashion-MNIST
# model and ResNet-18 on synthetic data, fp32 and bf16), and writes every log
# and the comparison's CSV to $OUT (the device tool's output folder).
# Every part has a timeout; the whole stays under ~7 minutes (GPU tests
# <= 120 + 90 s, the comparison <= 190 s), so one 8-minute device call holds it.
#   bash scripts/device_check.sh
# Exit status: the GPU tests' (the comparison's rows say how each run went).
set -uo pipefail
t0=$SECONDS
out="${OUT:-/tmp/device-check}"
mkdir -p "$out"
phase() { echo "$(( SECONDS - t0 )) s: $*" | tee -a "$out/timing.txt"; }
dir=$(mktemp -d)
tar -C "$dir" -xJf build-device/bundle.tar.xz || { echo "cannot unpack build-device/bundle.tar.xz" | tee "$out/error.txt"; exit 1; }
phase "bundle unpacked"
# cuDNN, cuBLAS, NCCL: the copies that the machine's PyTorch wheels ship.
nvidia_libs=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib")))))' 2>/dev/null || true)
# Only our binaries see the bundle's libraries (Debian's zlib, OpenBLAS, ...):
# PyTorch keeps the machine's own. bin/run wraps a binary with them.
libpath="$dir/lib:${nvidia_libs}:${LD_LIBRARY_PATH:-}"
cat > "$dir/run" <<EOF
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$libpath"
exec "\$@"
EOF
cat > "$dir/cnnflow" <<EOF
#!/usr/bin/env bash
exec "$dir/run" "$dir/bin/cnnflow" "\$@"
EOF
chmod +x "$dir/run" "$dir/cnnflow"
{
  date -u
  nvidia-smi -L || echo "no nvidia-smi"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  echo "host CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
  grep -o -w -E 'avx512f|avx512_fp16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' || true
  "$dir/cnnflow" devices || true
} 2>&1 | tee "$out/gpu.txt"
# Missing libraries show here first.
for b in ops_test pipeline_test cnnflow; do
  "$dir/run" ldd "$dir/bin/$b" | grep "not found" | sed "s/^/$b: /"
done | tee "$out/missing-libs.txt"

# An illegal instruction (exit 132) means the bundle was built for the build
# machine's CPU (-march=native) and this host lacks one of its extensions.
explain() {  # status what
  case "$1" in
    124|137) echo "$2: timed out" ;;
    132) echo "$2: illegal instruction (SIGILL): binaries built with -march=native for another CPU; rebuild with -DCNNFLOW_NATIVE=OFF" ;;
  esac
}

phase "GPU tests start"
timeout -k 10 120 "$dir/run" "$dir/bin/ops_test" --gtest_filter='*GPU*' 2>&1 | tee "$out/gpu-tests.txt"
status=${PIPESTATUS[0]}
# Through the whole graph (bench/configs/mlp2_synthetic.yaml on cpu:0 and cuda:0).
timeout -k 10 90 "$dir/run" "$dir/bin/pipeline_test" --gtest_filter='*GPU*' 2>&1 | tee -a "$out/gpu-tests.txt"
pstatus=${PIPESTATUS[0]}
[ "$status" -eq 0 ] && status=$pstatus
explain "$status" "GPU tests" | tee -a "$out/gpu-tests.txt"
echo "gpu tests exit status: $status" | tee -a "$out/gpu-tests.txt"
phase "GPU tests done (exit $status)"

# cnnflow vs PyTorch: its own budget of 170 s (runs that no longer fit are
# skipped), and a hard stop at 190 s; rows already done stay in the CSV.
timeout -k 10 190 bash bench/gpu_vs_pytorch.sh --cnnflow "$dir/cnnflow" --python python3 \
  --out "$out/bench" --budget 170 2>&1 | tee "$out/gpu-vs-pytorch.txt"
bench_status=${PIPESTATUS[0]}
explain "$bench_status" "gpu_vs_pytorch.sh" | tee -a "$out/gpu-vs-pytorch.txt"
phase "comparison done (exit $bench_status)"
cp "$out/bench/gpu_vs_pytorch.csv" "$out/gpu_vs_pytorch.csv" 2>/dev/null || true
echo "gpu tests exit status: $status; comparison exit status: $bench_status; total $(( SECONDS - t0 )) s"
exit "$status"
