#!/usr/bin/env bash
# A signal that reaches one rank of an MPI job (a preempted task, a Ctrl-C
# in one terminal): the ranks agree to stop after the same step, rank 0
# writes a checkpoint, both exit 130; `--resume` under mpirun finishes.
#   usage: mpi_stop_test.sh MPIEXEC CNNFLOW_BINARY
set -u
source "$(dirname "$0")/mpi_lib.sh"
mpiexec="$1"
cnnflow="$2"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sets=(--set train.epochs=1 --set train.max_steps=400 --set threads=1)
"$mpiexec" -n 2 --oversubscribe "$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" \
  --out "$out/run" > "$out/log" 2>&1 &
launcher=$!
rank1=$(wait_for_rank1 "$launcher" "$out/log") || exit 1
kill -TERM "$rank1"
wait "$launcher"
status=$?
grep -v "^train\|^eval" "$out/log" | tail -n 4
[[ $status -eq 130 ]] || { echo "FAIL: mpirun exit status $status, expected 130"; exit 1; }
grep -q "stopped by a signal" "$out/log" || { echo "FAIL: rank 0 did not report the stop"; exit 1; }
ls "$out/run/checkpoints/"step-*.json > /dev/null 2>&1 || { echo "FAIL: no checkpoint"; exit 1; }

"$mpiexec" -n 2 --oversubscribe "$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" \
  --resume "$out/run" > "$out/log2" 2>&1
status=$?
tail -n 1 "$out/log2"
[[ $status -eq 0 ]] || { cat "$out/log2"; echo "FAIL: resume exit status $status"; exit 1; }
grep -q "done after epoch 1" "$out/log2" || { echo "FAIL: the resumed run did not finish"; exit 1; }
echo "PASS: one rank signalled, all stopped at the same step, resumed"
