#!/usr/bin/env bash
# Gang restart (issue 16): a 2-rank job whose rank 1 is SIGKILLed after a
# checkpoint is relaunched by `cnnflow launch` (a fresh mpirun, every rank,
# --resume from the newest valid checkpoint) and ends bitwise equal to the
# uninterrupted job: model.safetensors byte for byte, metrics.csv but for
# its timing columns. Then resume swept the DALI way under mpirun: the
# uninterrupted job cut after a mid-epoch checkpoint (step 10) and after
# exactly one epoch (step 30), each resumed by `mpirun -n 2 ... --resume`,
# ends bitwise equal too.
#   usage: mpi_restart_test.sh MPIEXEC CNNFLOW_BINARY
set -u
source "$(dirname "$0")/mpi_lib.sh"
mpiexec="$1"
cnnflow="$2"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# 2 epochs of 30 steps, a checkpoint every 10 (and at the epoch's end).
sets=(--set train.epochs=2 --set train.max_steps=30 --set train.batch=32 --set threads=1
      --set train.checkpoint_every=10 --set train.keep_checkpoints=0 --set train.log_every=5)
timeout 120 "$mpiexec" -n 2 --oversubscribe "$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" \
  --out "$out/straight" > "$out/straight.log" 2>&1 || { cat "$out/straight.log"; echo "FAIL: uninterrupted run"; exit 1; }

timeout 180 "$cnnflow" launch --max-restarts 2 --mpirun "$mpiexec" -n 2 -- \
  "$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" --out "$out/killed" > "$out/log" 2>&1 &
launcher=$!
wait_for_file "$out/killed/checkpoints/step-000000020.json" "$out/log" || exit 1
rank1=$(mpi_rank_pid "$launcher" 1) || { cat "$out/log"; echo "FAIL: rank 1 not found"; exit 1; }
kill -KILL "$rank1"
wait "$launcher"
status=$?
grep "^cnnflow launch" "$out/log"
[[ $status -eq 0 ]] || { cat "$out/log"; echo "FAIL: launcher exit status $status"; exit 1; }
grep -q "attempt 1/3: .*mpirun\|attempt 1/3: .*-n 2" "$out/log" || { echo "FAIL: attempt 1 not logged"; exit 1; }
grep -Eq "restart 1/2: attempt 1 failed \((exit status [1-9][0-9]*|killed by signal [0-9]+.*)\); every rank resumes from checkpoint step (20|30|40|50) " "$out/log" ||
  { echo "FAIL: the restart is not logged with its status and checkpoint step"; exit 1; }
grep -q "attempt 2/3: .* --resume $out/killed" "$out/log" || { echo "FAIL: attempt 2 did not resume"; exit 1; }
[[ $(grep -c "restart [0-9]/2" "$out/log") -eq 1 ]] || { echo "FAIL: expected exactly one restart"; exit 1; }
expect_same_end_state "$out/straight" "$out/killed" || exit 1
for step in 10 30; do
  cut_run_at "$out/straight" "$out/cut-$step" "$step" || exit 1
  timeout 120 "$mpiexec" -n 2 --oversubscribe "$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" \
    --resume "$out/cut-$step" > "$out/cut-$step.log" 2>&1 || { cat "$out/cut-$step.log"; echo "FAIL: resume from step $step"; exit 1; }
  grep -q "resuming .*step-0000000$step.safetensors: epoch .*, step $step" "$out/cut-$step.log" ||
    { cat "$out/cut-$step.log"; echo "FAIL: did not resume from step $step"; exit 1; }
  expect_same_end_state "$out/straight" "$out/cut-$step" || { echo "(resumed from step $step)"; exit 1; }
done
echo "PASS: a rank SIGKILLed at step $(grep -o 'resumes from checkpoint step [0-9]*' "$out/log" | grep -o '[0-9]*$'), gang-restarted, ended bitwise equal; resumed from steps 10 and 30 bitwise equal"
