#!/usr/bin/env bash
# cnnflow train --trace: the summary on stdout, and a Chrome trace file with
# the spans of the layers (forward and backward) and of the loader.
#   usage: trace_test.sh CNNFLOW_BINARY
set -u
cnnflow="$1"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$cnnflow" train configs/fashion_mnist.yaml --set train.epochs=1 --set train.max_steps=40 \
  --set threads=2 --trace "$out/trace.json" --trace-steps 10 --out "$out/run" > "$out/log" 2>&1 ||
  { cat "$out/log"; echo "FAIL: train exited with $?"; exit 1; }
sed -n '/^profile of training steps/,/^(spans nest/p' "$out/log"
[[ -f "$out/trace.json" ]] || { echo "FAIL: no trace.json"; exit 1; }
ls "$out" | grep -q '\.tmp' && { echo "FAIL: a temporary file was left: $(ls "$out")"; exit 1; }
for want in '"name":"conv1 (conv2d)","cat":"forward","ph":"X"' \
            '"name":"conv1 (conv2d)","cat":"backward","ph":"X"' \
            '"name":"decode slice","cat":"load","ph":"X"' \
            '"name":"replica 0","cat":"step","ph":"X"' \
            '"name":"thread_name","ph":"M"'; do
  grep -qF "$want" "$out/trace.json" || { echo "FAIL: trace.json has no $want"; exit 1; }
done
# Steps 20..29 only: ten steps of replica 0.
steps=$(grep -cF '"name":"replica 0","cat":"step"' "$out/trace.json")
[[ $steps -eq 10 ]] || { echo "FAIL: $steps step spans, expected 10"; exit 1; }
echo "PASS: traced $steps steps"
