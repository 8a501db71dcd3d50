#!/usr/bin/env bash
# Ctrl-C during training: the step finishes, a checkpoint is written, the
# exit status is 130; `--resume` then finishes the run.
#   usage: sigint_test.sh CNNFLOW_BINARY
set -u
cnnflow="$1"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sets=(--set train.epochs=1 --set train.max_steps=300 --set threads=2)
"$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" --out "$out/run" > "$out/log" 2>&1 &
pid=$!
# Wait until training has started (the first progress line), then interrupt.
for _ in $(seq 1 300); do
  grep -q "train epoch 1/1" "$out/log" 2>/dev/null && break
  sleep 0.1
done
kill -INT "$pid"
wait "$pid"
status=$?
tail -n 2 "$out/log"
[[ $status -eq 130 ]] || { echo "FAIL: exit status $status, expected 130"; exit 1; }
grep -q "stopped by a signal" "$out/log" || { echo "FAIL: no stop message"; exit 1; }
ls "$out/run/checkpoints/"step-*.json > /dev/null 2>&1 || { echo "FAIL: no checkpoint after Ctrl-C"; exit 1; }

"$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" --resume "$out/run" > "$out/log2" 2>&1
status=$?
tail -n 1 "$out/log2"
[[ $status -eq 0 ]] || { echo "FAIL: resume exit status $status"; cat "$out/log2"; exit 1; }
grep -q "resuming .*step-" "$out/log2" || { echo "FAIL: did not resume from the checkpoint"; exit 1; }
[[ -s "$out/run/model.safetensors" ]] || { echo "FAIL: no model.safetensors after resume"; exit 1; }
echo "PASS: stopped with 130, checkpointed, resumed to the end"
