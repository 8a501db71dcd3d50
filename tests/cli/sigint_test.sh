#!/usr/bin/env bash
# Ctrl-C during training: the step finishes, the weights are saved, and the
# exit status is 130.   usage: sigint_test.sh CNNFLOW_BINARY
set -u
cnnflow="$1"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$cnnflow" train configs/fashion_mnist.yaml --set train.epochs=1 --set threads=2 --out "$out/run" \
  > "$out/log" 2>&1 &
pid=$!
# Wait until training has started (the first progress line), then interrupt.
for _ in $(seq 1 300); do
  grep -q "train epoch 1/1" "$out/log" 2>/dev/null && break
  sleep 0.1
done
kill -INT "$pid"
wait "$pid"
status=$?
cat "$out/log" | tail -n 2
[[ $status -eq 130 ]] || { echo "FAIL: exit status $status, expected 130"; exit 1; }
[[ -s "$out/run/model.safetensors" ]] || { echo "FAIL: no model.safetensors after Ctrl-C"; exit 1; }
grep -q "stopped by a signal" "$out/log" || { echo "FAIL: no stop message"; exit 1; }
echo "PASS: stopped with 130 and saved the weights"
