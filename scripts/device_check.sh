#!/usr/bin/env bash
# Runs on the lent GPU machine (../shared/DEVICE.md), from the repository
# root, with build-device/bundle.tar.xz carried over (scripts/device_bundle.sh);
# the rest (bench/configs/, graphs/, bench/*.py) travels with the working tree.
# Unpacks the bundle, shows the GPU, runs the GPU tests, then bf16 on the
# host CPU (bench/cpu_bf16_vs_pytorch.sh), then cnnflow vs PyTorch on the
# GPU side by side (bench/gpu_vs_pytorch.sh: the two-layer Fashion-MNIST
# model and ResNet-18 on synthetic data, fp32 and bf16), and writes every log
# and the comparisons' CSVs to $OUT (the device tool's output folder).
# Every part has a timeout: GPU tests <= 210 s (one process per suite), CPU
# bf16 <= 490 s, the GPU comparison <= 190 s. Measured on the H200
# (2026-12-04): GPU tests ~40 s, CPU bf16 ~250 s, the comparison ~130 s, so
# one 10-minute device call holds all three; DEVICE_CHECK_CPU_BENCH=0 and
# DEVICE_CHECK_GPU_BENCH=0 skip the two comparisons when a slow run would
# not fit.
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

# One process per test suite: a kernel fault is sticky in its CUDA context
# and would fail every later test of the process, so each suite starts
# clean and a crash costs one suite. 210 s for all of them (ops + graph);
# suites that no longer fit are listed as skipped. gpu-summary.txt: a line
# per suite.
phase "GPU tests start"
status=0
deadline=$(( SECONDS + 210 ))
: > "$out/gpu-tests.txt"
: > "$out/gpu-summary.txt"
for bin in ops_test pipeline_test; do
  suites=$("$dir/run" "$dir/bin/$bin" --gtest_list_tests --gtest_filter='*GPU*' 2>/dev/null |
           grep -v -e '^ ' -e '^Running main' | sed 's/\.$//')
  for suite in $suites; do
    left=$(( deadline - SECONDS ))
    if [ "$left" -lt 10 ]; then
      echo "$bin $suite: skipped (time budget)" | tee -a "$out/gpu-summary.txt"
      status=1
      continue
    fi
    limit=$(( left < 90 ? left : 90 ))
    timeout -k 5 "$limit" "$dir/run" "$dir/bin/$bin" --gtest_filter="$suite.*" > "$dir/suite.log" 2>&1
    s=$?
    cat "$dir/suite.log" >> "$out/gpu-tests.txt"
    result=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$dir/suite.log" | tr '\n' ' ')
    echo "$bin $suite: exit $s ${result}$(explain "$s" "")" | tee -a "$out/gpu-summary.txt"
    [ "$s" -ne 0 ] && status=$s
    # A failed suite runs again for diagnostics: each kernel reported at its
    # launch (not at a later sync), cuDNN explaining its errors, NCCL warning.
    left=$(( deadline - SECONDS ))
    if [ "$s" -ne 0 ] && [ "$left" -gt 20 ]; then
      CUDA_LAUNCH_BLOCKING=1 CUDNN_LOGLEVEL_DBG=1 CUDNN_LOGDEST_DBG=stderr NCCL_DEBUG=WARN \
        timeout -k 5 $(( left < 60 ? left - 10 : 60 )) "$dir/run" "$dir/bin/$bin" \
        --gtest_filter="$suite.*" > "$out/diagnose-${bin}-${suite//\//_}.txt" 2>&1
      echo "  (rerun with diagnostics: diagnose-${bin}-${suite//\//_}.txt)" | tee -a "$out/gpu-summary.txt"
    fi
  done
done
grep -E '^\[  FAILED  \] [A-Za-z]' "$out/gpu-tests.txt" | sort -u | tee -a "$out/gpu-summary.txt"
echo "gpu tests exit status: $status" | tee -a "$out/gpu-summary.txt"
phase "GPU tests done (exit $status)"

# bf16 on the host CPU (issue 32: graph.precision bf16 on cpu:K needs
# avx512_bf16 or AMX, which the build machine may lack): its tests, the
# oneDNN implementations a bf16 step runs (ONEDNN_VERBOSE), where the time
# of a ResNet-18 step goes in fp32 and bf16, and ResNet-18 against
# PyTorch's bf16 autocast on 2 pinned cores (DEVICE_CHECK_CPU_BENCH=0
# skips that). <= 490 s.
phase "CPU bf16 start"
timeout -k 5 60 "$dir/run" "$dir/bin/ops_test" --gtest_filter='Bf16Cpu*' > "$out/cpu-bf16-tests.txt" 2>&1
cpu_bf16_status=$?
echo "Bf16Cpu tests: exit $cpu_bf16_status $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$out/cpu-bf16-tests.txt" | tr '\n' ' ')$(explain "$cpu_bf16_status" "")" | tee -a "$out/gpu-summary.txt"
grep -E '^\[  FAILED  \] [A-Za-z]' "$out/cpu-bf16-tests.txt" | sort -u | tee -a "$out/gpu-summary.txt"
r18=(bench/configs/resnet18_synthetic.yaml --set threads=2 --set train.batch=64
     --set 'graph.devices=[cpu:0]')
ONEDNN_VERBOSE=1 timeout -k 5 60 taskset -c 0-1 "$dir/cnnflow" bench "${r18[@]}" --devices 1 \
  --warmup 1 --max-steps 1 --set graph.precision=bf16 > "$dir/verbose.log" 2>&1
echo "exit $?; $(grep -c _verbose "$dir/verbose.log") verbose lines" > "$out/cpu-bf16-onednn-impls.txt"
grep -E '_verbose,exec,cpu,(convolution|matmul|reorder)' "$dir/verbose.log" | cut -d, -f4,5,6 |
  sort | uniq -c | sort -rn >> "$out/cpu-bf16-onednn-impls.txt"
grep -v _verbose "$dir/verbose.log" | tail -5 >> "$out/cpu-bf16-onednn-impls.txt"
ONEDNN_MAX_CPU_ISA=AVX2 "$dir/cnnflow" validate "${r18[@]}" --set graph.precision=bf16 \
  > "$out/cpu-bf16-capped.txt" 2>&1
echo "capped at AVX2: exit $? (want 1: refused, not emulated)" | tee -a "$out/cpu-bf16-capped.txt"
# Where a step's time goes, fp32 against bf16: --trace over steps 20..30,
# summed by layer type and pass (bench/trace_by_layer_type.py).
for p in fp32 bf16; do
  timeout -k 5 90 taskset -c 0-1 "$dir/cnnflow" train "${r18[@]}" --set data.train.size=2560 \
    --set train.epochs=1 --set data.test=null --set graph.precision=$p \
    --trace "$out/trace-$p.json" --trace-steps 10 > "$dir/trace-$p.log" 2>&1
  echo "$p: exit $?" | tee "$out/cpu-bf16-profile-$p.txt"
  python3 bench/trace_by_layer_type.py "$out/trace-$p.json" | tee -a "$out/cpu-bf16-profile-$p.txt"
done
if [ "${DEVICE_CHECK_CPU_BENCH:-1}" != 0 ]; then
  timeout -k 10 190 bash bench/cpu_bf16_vs_pytorch.sh --cnnflow "$dir/cnnflow" --python python3 \
    --threads 2 --reps 2 --steps 15 --warmup 3 --run-timeout 40 --out "$out/cpu-bf16" 2>&1 |
    tee "$out/cpu-bf16-vs-pytorch.txt"
fi
phase "CPU bf16 done (tests exit $cpu_bf16_status)"
[ "$cpu_bf16_status" -ne 0 ] && status=$cpu_bf16_status

# cnnflow vs PyTorch on the GPU: its own budget of 170 s (runs that no
# longer fit are skipped), and a hard stop at 190 s; rows already done stay
# in the CSV. DEVICE_CHECK_GPU_BENCH=0 skips it (a run that changed no GPU
# code, to save device time).
bench_status=skipped
if [ "${DEVICE_CHECK_GPU_BENCH:-1}" != 0 ]; then
  timeout -k 10 190 bash bench/gpu_vs_pytorch.sh --cnnflow "$dir/cnnflow" --python python3 \
    --out "$out/bench" --budget 170 2>&1 | tee "$out/gpu-vs-pytorch.txt"
  bench_status=${PIPESTATUS[0]}
  explain "$bench_status" "gpu_vs_pytorch.sh" | tee -a "$out/gpu-vs-pytorch.txt"
  phase "comparison done (exit $bench_status)"
  cp "$out/bench/gpu_vs_pytorch.csv" "$out/gpu_vs_pytorch.csv" 2>/dev/null || true
fi
echo "gpu tests exit status: $status; comparison exit status: $bench_status; total $(( SECONDS - t0 )) s"
exit "$status"
