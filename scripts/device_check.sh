#!/usr/bin/env bash
# Runs on the lent GPU machine (../shared/DEVICE.md), from the repository
# root, with build-device/bundle.tar.xz carried over (scripts/device_bundle.sh);
# the rest (bench/configs/, graphs/, bench/*.py) travels with the working tree.
# Unpacks the bundle, shows the GPU, then runs the phases asked for, in
# order, and writes every log and CSV to $OUT (the device tool's output
# folder). Each phase has its own timeout, stays under 10 minutes and reruns
# its own baseline, so one phase can be repeated without the others:
#   tests           the GPU test suites, one process each (<= 420 s; ~40 s
#                   on the H200, 2026-12-04, with a third of today's suites)
#   compare         bench/gpu_vs_pytorch.sh: the Fashion-MNIST model and
#                   ResNet-18, fp32 and bf16, against PyTorch eager (<= 190 s)
#   cpu-bf16        bf16 on the host CPU: its tests, oneDNN's kernels, a
#                   profile, bench/cpu_bf16_vs_pytorch.sh (<= 490 s)
#   resnet18-fp32, resnet18-bf16, resnet50-fp32, resnet50-bf16
#                   bench/gpu_resnet_best.sh: cnnflow NCHW and channels_last
#                   against PyTorch's best eager and torch.compile, medians
#                   of 3 alternating rounds, then a --trace profile of
#                   cnnflow's best layout reduced by bench/gpu_profile_table.py
#                   and PyTorch's profiler (<= 540 s each; issue 54)
#   speedrun        the CIFAR speed run on cuda:0 with data.device_resident
#                   on and off, and on with graph.cuda_graph, channels_last,
#                   2 epochs, on data/cifar10-*.lmdb when carried
#                   (scripts/prepare_cifar10.sh), else on the JPEG sample of
#                   tests/data (<= 440 s; issue 59)
#   replicas        issue 55's tables: ResNet-18 with 1 and 2 replicas on the
#                   one GPU (cnnflow bench --devices 1,2 over [cuda:0,
#                   cuda:0]: the cost of the lanes' streams and collective),
#                   and graph.deterministic's cost against the default
#                   (<= 300 s)
#   pipeline        issue 60's table: the small CNN and ResNet-18 cut in 2
#                   stages on the one GPU ([cuda:0, cuda:0], a lane per
#                   stage) against the unsplit model on it (cnnflow bench),
#                   fp32 and bf16 (<= 300 s)
#   tensor-parallel issue 60's table: ResNet-18 at 224 with its convs split
#                   over 2 lanes of the one GPU against unsplit, batch-1 and
#                   batch-8 inference latency and training at batch 8
#                   (tensor_parallel_bench --device cuda:0; <= 240 s)
#   memory          issue 55: validate's predicted peak GPU memory against
#                   the pools' measured peak (GpuMemoryGPU: ResNet-18 CIFAR
#                   and ResNet-50 at 224, within 15%), and the train run's
#                   line that prints both (<= 200 s)
#   tta             time to accuracy (issue 59): bench/time_to_accuracy.sh
#                   --device cuda, cnnflow's speed run (device-resident,
#                   fp16) against the airbench port compiled and eager, 5
#                   seeds, on the CIFAR-10 JPEGs carried as
#                   data/cifar10-jpeg.tar.gz (cp ../shared/data/ first;
#                   carry it), made into LMDBs here (<= 560 s)
#   bash scripts/device_check.sh [PHASE ...]      (default: tests compare)
# DEVICE_CHECK_CPU_BENCH=0 skips cpu-bf16's PyTorch comparison.
# Exit status: the GPU tests' when they ran, else the last failing phase's.
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

phase_tests() {
# One process per test suite: a kernel fault is sticky in its CUDA context
# and would fail every later test of the process, so each suite starts
# clean and a crash costs one suite. 420 s for all of them (ops + graph);
# suites that no longer fit are listed as skipped. gpu-summary.txt: a line
# per suite.
phase "GPU tests start"
status=0
deadline=$(( SECONDS + 420 ))
: > "$out/gpu-tests.txt"
: > "$out/gpu-summary.txt"
for bin in ops_test pipeline_test; do
  # GpuMemoryGPU trains ResNet-50 at 224: the memory phase runs it.
  suites=$("$dir/run" "$dir/bin/$bin" --gtest_list_tests --gtest_filter='*GPU*:-GpuMemoryGPU.*' 2>/dev/null |
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
}

phase_cpu_bf16() {
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
[ "$cpu_bf16_status" -ne 0 ] && other_status=$cpu_bf16_status
}

# cnnflow vs PyTorch on the GPU: its own budget of 170 s (runs that no
# longer fit are skipped), and a hard stop at 190 s; rows already done stay
# in the CSV.
phase_compare() {
  timeout -k 10 190 bash bench/gpu_vs_pytorch.sh --cnnflow "$dir/cnnflow" --python python3 \
    --out "$out/bench" --budget 170 2>&1 | tee "$out/gpu-vs-pytorch.txt"
  local s=${PIPESTATUS[0]}
  explain "$s" "gpu_vs_pytorch.sh" | tee -a "$out/gpu-vs-pytorch.txt"
  phase "comparison done (exit $s)"
  cp "$out/bench/gpu_vs_pytorch.csv" "$out/gpu_vs_pytorch.csv" 2>/dev/null || true
  [ "$s" -ne 0 ] && other_status=$s
}

# One ResNet table (issue 54): the comparison (<= 420 s), then where a step's
# GPU time goes in cnnflow's channels_last run and PyTorch's best eager one
# (<= 60 s each), side by side by kernel class.
phase_resnet() {  # model precision
  local model=$1 precision=$2 name="$1-$2"
  timeout -k 10 420 bash bench/gpu_resnet_best.sh --model "$model" --precision "$precision" \
    --cnnflow "$dir/cnnflow" --python python3 --compile-timeout 150 --out "$out/$name" 2>&1 |
    tee "$out/$name.txt"
  local s=${PIPESTATUS[0]}
  explain "$s" "gpu_resnet_best.sh $name" | tee -a "$out/$name.txt"
  local config=bench/configs/${model}_synthetic.yaml batch=256
  [ "$model" = resnet50 ] && batch=128
  timeout -k 5 60 "$dir/cnnflow" train "$config" --set 'graph.devices=[cuda:0]' \
    --set graph.precision="$precision" --set graph.channels_last=true --set train.batch=$batch \
    --set data.train.size=$(( batch * 40 )) --set train.epochs=1 --set data.test=null \
    --trace "$out/$name-trace.json" --trace-steps 10 > "$out/$name-trace.log" 2>&1
  timeout -k 5 60 python3 bench/pytorch_train.py --model "$model" --device cuda \
    --precision "$precision" --channels-last --tf32 --source synthetic --feed host \
    --batch $batch --steps 10 --warmup 5 --profile "$out/$name-torch.json" --profile-steps 10 \
    > "$out/$name-torch-profile.log" 2>&1
  python3 bench/gpu_profile_table.py --cnnflow "$out/$name-trace.json" \
    --torch "$out/$name-torch.json" > "$out/$name-profile.txt" 2>&1
  phase "$name done (exit $s)"
  [ "$s" -ne 0 ] && other_status=$s
}

# The CIFAR speed run on the GPU (issue 59): 2 epochs of the recipe with the
# training set held on the GPU, on the carried LMDBs or the JPEG sample.
phase_speedrun() {
  local data=() tmp
  if [ -d data/cifar10-train.lmdb ] && [ -d data/cifar10-test.lmdb ]; then
    data=(--set data.train.path=data/cifar10-train.lmdb --set data.test.path=data/cifar10-test.lmdb)
  else
    tmp=$(mktemp -d)
    "$dir/cnnflow" convert --from folder tests/data/cifar10-jpeg-sample --to "$tmp/sample.lmdb" \
      > "$out/speedrun-convert.log" 2>&1
    data=(--set data.train.path="$tmp/sample.lmdb" --set data.test.path="$tmp/sample.lmdb"
          --set train.batch=8 --set train.eval_batch=8)  # 20 images
  fi
  # The resident set with the steps as CUDA graphs too (graph.cuda_graph).
  local run resident graphs
  for run in resident-true resident-false resident-true-cuda-graph; do
    resident=true graphs=false
    [[ "$run" == resident-false ]] && resident=false
    [[ "$run" == *cuda-graph ]] && graphs=true
    timeout -k 5 140 "$dir/cnnflow" train configs/cifar10_speedrun.yaml \
      --set 'graph.devices=[cuda:0]' --set data.device_resident=$resident --set train.epochs=2 \
      --set graph.cuda_graph=$graphs \
      --set 'train.schedule={decay: piecewise, milestones: [0, 0.5, 2], factors: [0.2, 1, 0.07]}' \
      "${data[@]}" --out "$out/speedrun-$run" > "$out/speedrun-$run.log" 2>&1
    local s=$?
    echo "speedrun, $run: exit $s$(explain "$s" "") $(grep -E 'timed span|accuracy|CUDA graphs' "$out/speedrun-$run.log" | tail -3 | tr '\n' ' ')" | tee -a "$out/speedrun.txt"
    [ "$s" -ne 0 ] && other_status=$s
  done
  phase "speedrun done"
}

# Replicas on one GPU and the deterministic mode's cost (issue 55), fp32
# and bf16, ResNet-18 CIFAR at 128 rows per replica.
phase_replicas() {
  local r18=(bench/configs/resnet18_synthetic.yaml --max-steps 100 --warmup 10
             --set train.batch=128)
  for p in fp32 bf16; do
    timeout -k 5 120 "$dir/cnnflow" bench "${r18[@]}" --devices 1,2 \
      --set 'graph.devices=[cuda:0, cuda:0]' --set graph.precision=$p \
      > "$out/replicas-$p.txt" 2>&1
    echo "one GPU, 1 vs 2 replicas, $p: exit $?" | tee -a "$out/replicas.txt"
    tail -4 "$out/replicas-$p.txt" | tee -a "$out/replicas.txt"
  done
  for det in false true; do
    timeout -k 5 60 "$dir/cnnflow" bench "${r18[@]}" --devices 1 --set 'graph.devices=[cuda:0]' \
      --set graph.deterministic=$det --set graph.tf32=false > "$out/deterministic-$det.txt" 2>&1
    echo "graph.deterministic $det (tf32 off): exit $?" | tee -a "$out/replicas.txt"
    tail -2 "$out/deterministic-$det.txt" | tee -a "$out/replicas.txt"
  done
  phase "replicas done"
}

# Pipelines on the GPU (issue 60): each stage a lane of the one GPU, against
# the unsplit model on it; synthetic data.
phase_pipeline() {
  local fm=(configs/fashion_mnist_pipeline.yaml --max-steps 200 --warmup 20
            --set 'data.train={source: synthetic, shape: [1, 28, 28], classes: 10, size: 65536, seed: 1}')
  local r18=(bench/configs/resnet18_synthetic.yaml --max-steps 60 --warmup 10
             --set graph.template=graphs/pipeline_parallel.yaml
             --set 'graph.pipeline={stages: auto, microbatches: 4}')
  for p in fp32 bf16; do
    for cfg in fm r18; do
      local -n args=$cfg
      timeout -k 5 70 "$dir/cnnflow" bench "${args[@]}" --set 'graph.devices=[cuda:0, cuda:0]' \
        --set graph.precision=$p > "$out/pipeline-$cfg-$p.txt" 2>&1
      echo "pipeline $cfg $p: exit $?" | tee -a "$out/pipeline.txt"
      tail -5 "$out/pipeline-$cfg-$p.txt" | tee -a "$out/pipeline.txt"
    done
  done
  phase "pipeline done"
}

# Tensor parallelism on the GPU (issue 60): the members lanes of the one GPU.
phase_tensor_parallel() {
  timeout -k 5 230 "$dir/run" "$dir/bin/tensor_parallel_bench" \
    --config bench/configs/resnet18_224_tensor_parallel.yaml --device cuda:0 --batch 1,8 \
    --train-batch 8 --reps 7 > "$out/tensor-parallel.txt" 2>&1
  local s=$?
  explain "$s" "tensor_parallel_bench" | tee -a "$out/tensor-parallel.txt"
  tail -8 "$out/tensor-parallel.txt"
  phase "tensor-parallel done (exit $s)"
  [ "$s" -ne 0 ] && other_status=$s
}

# Issue 55: each GPU's peak memory as validate predicts it against the
# pools' measured peak, in the test suite and in a train run's end line.
phase_memory() {
  timeout -k 5 150 "$dir/run" "$dir/bin/pipeline_test" --gtest_filter='GpuMemoryGPU.*' \
    > "$out/memory-tests.txt" 2>&1
  local s=$?
  echo "GpuMemoryGPU: exit $s$(explain "$s" "") $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$out/memory-tests.txt" | tr '\n' ' ')" | tee -a "$out/memory.txt"
  grep -E -A1 'measured [0-9]+ MB, predicted' "$out/memory-tests.txt" | tee -a "$out/memory.txt"
  [ "$s" -ne 0 ] && other_status=$s
  local r18=(bench/configs/resnet18_synthetic.yaml --set 'graph.devices=[cuda:0]' --set threads=2)
  "$dir/cnnflow" validate "${r18[@]}" 2>&1 | grep 'GPU memory' | tee -a "$out/memory.txt"
  timeout -k 5 45 "$dir/cnnflow" train "${r18[@]}" --set train.max_steps=20 \
    --out "$dir/memory-run" > "$out/memory-train.log" 2>&1
  s=$?
  echo "train ResNet-18, 20 steps: exit $s$(explain "$s" "") $(grep 'peak memory on' "$out/memory-train.log")" | tee -a "$out/memory.txt"
  [ "$s" -ne 0 ] && other_status=$s
  phase "memory done"
}

# Time to accuracy on the GPU (issue 59): the JPEGs carried, the LMDBs made
# here, both sides alternating seed by seed within the budget.
phase_tta() {
  if [ ! -f data/cifar10-jpeg.tar.gz ]; then
    echo "tta: no data/cifar10-jpeg.tar.gz carried: skipped" | tee -a "$out/tta.txt"
    other_status=1
    return
  fi
  # data/cifar10-jpeg/ and data/cifar10-{train,test}.lmdb, where the config reads them.
  CNNFLOW="$dir/cnnflow" bash scripts/prepare_cifar10.sh data/cifar10-jpeg.tar.gz \
    > "$out/tta-prepare.log" 2>&1
  phase "tta: data ready"
  timeout -k 10 500 bash bench/time_to_accuracy.sh --device cuda --precision fp16 \
    --seeds "0 1 2 3 4" --python python3 --cnnflow "$dir/cnnflow" --data data \
    --budget 480 --logs "$out/tta" --csv "$out/time-to-accuracy.csv" 2>&1 | tee "$out/tta.txt"
  local s=${PIPESTATUS[0]}
  explain "$s" "time_to_accuracy.sh" | tee -a "$out/tta.txt"
  phase "tta done (exit $s)"
  [ "$s" -ne 0 ] && other_status=$s
}

status=0
other_status=0
ran_tests=0
[ $# -eq 0 ] && set -- tests compare
for p in "$@"; do
  case "$p" in
    tests) phase_tests; ran_tests=1 ;;
    compare) phase_compare ;;
    cpu-bf16) phase_cpu_bf16 ;;
    resnet18-fp32|resnet18-bf16|resnet50-fp32|resnet50-bf16) phase_resnet "${p%-*}" "${p#*-}" ;;
    speedrun) phase_speedrun ;;
    tta) phase_tta ;;
    replicas) phase_replicas ;;
    pipeline) phase_pipeline ;;
    tensor-parallel) phase_tensor_parallel ;;
    memory) phase_memory ;;
    *) echo "unknown phase '$p' (tests compare cpu-bf16 resnet18-fp32 resnet18-bf16 resnet50-fp32 resnet50-bf16 speedrun tta replicas pipeline tensor-parallel memory)" | tee -a "$out/error.txt"; other_status=2 ;;
  esac
done
echo "phases: $*; gpu tests exit status: $status; other phases: $other_status; total $(( SECONDS - t0 )) s"
[ "$ran_tests" = 1 ] && exit "$status"
exit "$other_status"
