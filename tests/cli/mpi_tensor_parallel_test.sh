#!/usr/bin/env bash
# Tensor-parallel groups that span processes (ops/parallel/data_parallel.h):
#   equal: `mpirun -n 2`, one device each, one group of 2 == one process
#          with the group's 2 devices: the same model.safetensors, bit for
#          bit, and the same metrics; and `mpirun -n 4` (2 data-parallel
#          groups of 2 processes, each group on a communicator of its own)
#          == one process with 4 devices (2 x 2), to float noise.
#   stall: rank 1 stops (SIGSTOP) as it starts a step; rank 0 fails within
#          graph.collective_timeout_s + 5 s, naming the split layer whose
#          collective it waited in, and the job ends.
#   usage: mpi_tensor_parallel_test.sh MPIEXEC CNNFLOW_BINARY equal|stall
set -u
source "$(dirname "$0")/mpi_lib.sh"
mpiexec="$1"
cnnflow="$2"
mode="$3"
out=$(mktemp -d)
rank1=""
trap '[[ -n "$rank1" ]] && kill -CONT "$rank1" 2>/dev/null; rm -rf "$out"' EXIT
split='{conv2: column, fc1: column, fc2: row}'

if [[ $mode == equal ]]; then
  sets=(--set train.epochs=2 --set train.max_steps=12 --set train.batch=32)
  # run NAME PROCESSES DEVICES THREADS: under mpirun, or in one process; one
  # thread per device everywhere (kernels sum in an order that depends on
  # their threads).
  run() {
    local name=$1 n=$2 devices=$3 threads=$4 size=2
    local cmd=("$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}"
               --set "graph.devices=$devices" --set "graph.tensor_parallel={size: $size, layers: $split}"
               --out "$out/$name")
    if (( n > 1 )); then cmd=(timeout 240 "$mpiexec" -n "$n" --oversubscribe "${cmd[@]}"); fi
    cmd+=(--set threads="$threads")
    "${cmd[@]}" > "$out/$name.log" 2>&1 || { cat "$out/$name.log"; echo "FAIL: $name"; exit 1; }
  }
  run mpi2 2 '[cpu:0]' 1
  run one2 1 '[cpu:0, cpu:1]' 2
  run mpi4 4 '[cpu:0]' 1
  run one4 1 '[cpu:0, cpu:1, cpu:2, cpu:3]' 4
  # 2 processes: bit for bit (a sum of 2 is the same in any order). 4: the
  # gradient sum over 4 replicas runs in MPI's order, not the in-process
  # group's, so float noise (relative 5e-4 on the losses, 5 test images);
  # a group formed of the wrong processes, or members reading different
  # rows, is off by percents.
  cmp "$out/mpi2/model.safetensors" "$out/one2/model.safetensors" ||
    { echo "FAIL: mpi2 and one2 trained different weights"; exit 1; }
  for pair in "mpi2 one2 1e-6 0" "mpi4 one4 5e-4 0.0005"; do
    set -- $pair
    # epoch, train_loss, train_accuracy, test_loss, test_accuracy (an MPI
    # job sums its processes' metrics in float: the losses' last digit).
    paste -d, "$out/$1/metrics.csv" "$out/$2/metrics.csv" | tail -n +2 | awk -F, -v tol="$3" -v acc="$4" '
      function abs(x) { return x < 0 ? -x : x }
      { n = NF / 2
        if ($1 != $(n + 1) || abs($3 - $(n + 3)) > acc || abs($5 - $(n + 5)) > acc ||
            abs($2 - $(n + 2)) > tol * abs($(n + 2)) || abs($4 - $(n + 4)) > tol * abs($(n + 4))) {
          print "epoch " $1 " differs"; bad = 1 } }
      END { exit bad }' || { echo "FAIL: $1 and $2 report different metrics"; exit 1; }
    [[ $(grep -c "^done after" "$out/$1.log") -eq 1 ]] || { echo "FAIL: $1: expected one report"; exit 1; }
  done
  cat "$out/mpi4/metrics.csv" "$out/one4/metrics.csv"
  echo "PASS: tensor-parallel groups across processes train bit for bit as in one process"
  exit 0
fi

# stall: rank 1 stops itself (CNNFLOW_TEST_FAULT mode=stop, ops/test_fault.h)
# as it starts step 5's forward, after the step-4 collectives both ranks
# finished; rank 0 goes on into step 5 and waits in the first split layer's
# forward all-gather (conv2's), which must fail by name within the bound,
# timed from the hook's line. (A SIGSTOP from outside landed at a random
# point, often in a gradient bucket, which fails by that name instead.)
hook_line="CNNFLOW_TEST_FAULT: rank 1 stop at step 5"
timeout -k 5 $((120 * slowdown)) "$mpiexec" -n 2 --oversubscribe -x "CNNFLOW_TEST_FAULT=rank=1,step=5,mode=stop" \
  "$cnnflow" train configs/fashion_mnist.yaml \
  --set train.epochs=1 --set threads=1 --set graph.collective_timeout_s=3 \
  --set "graph.tensor_parallel={size: 2, layers: $split}" --out "$out/run" > "$out/log" 2>&1 &
launcher=$!
rank1=$(wait_for_rank1 "$launcher" "$out/log") || { kill -KILL "$launcher"; exit 1; }
t0=""
for _ in $(seq 1 $((600 * slowdown))); do
  grep -q "$hook_line" "$out/log" 2>/dev/null && t0=$EPOCHREALTIME && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.05
done
wait "$launcher"
status=$?
[[ -n "$t0" ]] || { cat "$out/log"; echo "FAIL: rank 1 never stopped"; exit 1; }
elapsed=$(since "$t0")
grep "error" "$out/log" | head -n 2
[[ $status -ne 0 && $status -ne 124 ]] || { cat "$out/log"; echo "FAIL: exit status $status (124: hung)"; exit 1; }
le "$elapsed" $((3 + 5)) || { echo "FAIL: took ${elapsed} s"; exit 1; }
grep -qE "rank 0 of 2: error: .*tensor-parallel group 0: member 0 of 2: MPI AllReduceSum 'layer conv2 forward all-gather' .*did not complete within 3 s" "$out/log" ||
  { cat "$out/log"; echo "FAIL: rank 0 did not name conv2's forward all-gather"; exit 1; }
echo "PASS: a stalled member failed the job in ${elapsed} s, naming the layer"
