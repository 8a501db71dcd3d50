#!/usr/bin/env bash
# Logical replicas: a run of G = 8 replicas (graph.logical_replicas) trains
# to the same bytes on any layout: 1 process x 8 == 2 x 4 == 3 processes
# (3 + 3 + 2, not a power of two and uneven) == 8 x 1, once on a BN CNN with
# SyncBN and once without SyncBN on a training set whose last global batch
# is short (523 samples, 64 a step: 11 rows over 8 replicas). Then a run
# written by 2 processes x 1 replica resumes as 1 process x 2 replicas from
# its checkpoint (the checkpoint's identity leaves the layout out) and ends
# as the uninterrupted run, and a resume that changes G is refused naming it.
#   usage: mpi_logical_replicas_test.sh MPIEXEC CNNFLOW_BINARY
set -u
mpiexec="$1"
cnnflow="$2"
source "$(dirname "$0")/mpi_lib.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cat > "$out/bn.yaml" << 'EOF'
name: logical-replicas
seed: 5
threads: 1
data:
  train: {source: synthetic, shape: [1, 16, 16], size: 512}
  test: {source: synthetic, shape: [1, 16, 16], size: 64}
model:
  input: [1, 16, 16]
  layers:
    - {name: conv1, conv2d: {out: 8, kernel: 3, pad: 1, bias: false}}
    - {name: bn1, batchnorm: {}}
    - {name: relu1, relu: {}}
    - {name: pool1, maxpool2d: {kernel: 4}}
    - {name: flatten, flatten: {}}
    - {name: fc, linear: {out: 10}}
train: {epochs: 2, batch: 8, optimizer: {sgd: {lr: 0.1, momentum: 0.9}}}
graph: {devices: [cpu:0], logical_replicas: 8, collective_timeout_s: 60}
EOF

# run NAME PROCESSES CONFIG SETS...: trains CONFIG on PROCESSES processes
# (1: no mpirun) into $out/NAME.
run() {
  local name=$1 procs=$2 config=$3
  shift 3
  local cmd=("$cnnflow" train "$config" "$@" --out "$out/$name")
  ((procs > 1)) && cmd=("$mpiexec" -n "$procs" --oversubscribe "${cmd[@]}")
  "${cmd[@]}" > "$out/$name.log" 2>&1 || { cat "$out/$name.log"; echo "FAIL: $name"; exit 1; }
}

for case in syncbn short; do
  sets=()
  [[ $case == syncbn ]] && sets=(--set graph.sync_bn=true)
  [[ $case == short ]] && sets=(--set "data.train={source: synthetic, shape: [1, 16, 16], size: 523}")
  run "$case-1x8" 1 "$out/bn.yaml" "${sets[@]}"
  for procs in 2 3 8; do
    run "$case-${procs}p" "$procs" "$out/bn.yaml" "${sets[@]}"
    expect_same_end_state "$out/$case-1x8" "$out/$case-${procs}p" ||
      { echo "FAIL: $case: $procs processes != 1 process x 8"; exit 1; }
  done
  [[ $(wc -l < "$out/$case-1x8/metrics.csv") -eq 3 ]] || { echo "FAIL: $case: expected 2 epochs"; exit 1; }
  echo "$case: 1 process x 8 == 2 x 4 == 3 (3 + 3 + 2) == 8 x 1 replicas, byte for byte"
done

# A checkpoint of 2 processes x 1 replica (G = 2 by default) resumed as one
# process with 2 replicas. Rank 1 dies at step 13; the checkpoint is step 10.
ckpt=(--set graph.logical_replicas=0 --set train.checkpoint_every=5 --set train.keep_checkpoints=0)
run whole 1 "$out/bn.yaml" "${ckpt[@]}" --set 'graph.devices=[cpu:0, cpu:1]' --set threads=2
CNNFLOW_TEST_FAULT="rank=1,step=13,mode=exit1" "$mpiexec" -n 2 --oversubscribe "$cnnflow" train \
  "$out/bn.yaml" "${ckpt[@]}" --out "$out/cut" > "$out/cut.log" 2>&1 &&
  { cat "$out/cut.log"; echo "FAIL: the job with a dying rank succeeded"; exit 1; }
[[ -f $out/cut/checkpoints/step-000000010.safetensors ]] || { ls -R "$out/cut"; echo "FAIL: no checkpoint at step 10"; exit 1; }
"$cnnflow" train "$out/bn.yaml" "${ckpt[@]}" --set 'graph.devices=[cpu:0, cpu:1]' --set threads=2 \
  --resume "$out/cut" > "$out/resume.log" 2>&1 || { cat "$out/resume.log"; echo "FAIL: resume as 1 x 2"; exit 1; }
grep -q "resuming .*step-000000010" "$out/resume.log" || { cat "$out/resume.log"; echo "FAIL: not resumed from step 10"; exit 1; }
expect_same_end_state "$out/whole" "$out/cut" no-steps ||
  { echo "FAIL: 2 x 1 resumed as 1 x 2 differs from the uninterrupted run"; exit 1; }
echo "a 2 x 1 checkpoint resumed as 1 x 2 ends as the uninterrupted run"

# Another G is another experiment: refused, naming it.
"$cnnflow" train "$out/bn.yaml" "${ckpt[@]}" --set graph.logical_replicas=4 --resume "$out/cut" \
  > "$out/refused.log" 2>&1 && { cat "$out/refused.log"; echo "FAIL: a resume with G = 4 of G = 2 ran"; exit 1; }
grep -q "graph.logical_replicas is 2 there, 4 here" "$out/refused.log" ||
  { cat "$out/refused.log"; echo "FAIL: the refusal does not name graph.logical_replicas"; exit 1; }
echo "a resume with another G is refused: $(grep -o 'graph.logical_replicas is [^;]*' "$out/refused.log")"
echo "PASS: logical replicas: every layout of G = 8 trains the same bytes; a checkpoint resumes on another layout"
