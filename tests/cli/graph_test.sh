#!/usr/bin/env bash
# cnnflow graph: the train and eval graphs as DOT, SVG and PNG, one node per
# device for the per-device stages; a bad target is refused and leaves no file.
#   usage: graph_test.sh CNNFLOW_BINARY
set -u
cnnflow="$1"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
devs=(--set "graph.devices=[cpu:0, cpu:1]")
"$cnnflow" graph configs/fashion_mnist.yaml -o "$out/g.dot" "${devs[@]}" > "$out/log" 2>&1 ||
  { cat "$out/log"; fail "graph -o g.dot exited with $?"; }
for want in 'subgraph "cluster_train"' 'subgraph "cluster_eval"' \
            '"train.devices[cpu:1]" -> "train.allreduce[cpu:1]";' \
            '"train.optimizer[cpu:0]" -> "train.metrics";' \
            '"train.load" -> "train.devices[cpu:0]";'; do
  grep -qF "$want" "$out/g.dot" || fail "g.dot has no $want"
done
grep -qF '"train.devices[cpu:0]" -> "train.allreduce[cpu:1]"' "$out/g.dot" && fail "lanes crossed"
ls "$out" | grep -q tmp && fail "a temporary file was left: $(ls "$out")"
# .svg through Graphviz where it is installed, else a clear error and no file.
if command -v dot > /dev/null; then
  "$cnnflow" graph configs/fashion_mnist.yaml -o "$out/g.svg" "${devs[@]}" > "$out/log" 2>&1 ||
    { cat "$out/log"; fail "graph -o g.svg exited with $?"; }
  grep -q '<svg' "$out/g.svg" || fail "g.svg is not SVG"
  grep -qF 'devices[cpu:1]' "$out/g.svg" || fail "g.svg has no per-device node"
  "$cnnflow" graph configs/fashion_mnist.yaml -o "$out/g.png" "${devs[@]}" > "$out/log" 2>&1 ||
    { cat "$out/log"; fail "graph -o g.png exited with $?"; }
  [[ "$(head -c 8 "$out/g.png" | od -An -tx1 | tr -d ' \n')" == 89504e470d0a1a0a ]] || fail "g.png is not a PNG"
else
  "$cnnflow" graph configs/fashion_mnist.yaml -o "$out/g.svg" > "$out/log" 2>&1 && fail "svg without dot"
  grep -q "apt-get install graphviz" "$out/log" || { cat "$out/log"; fail "no install hint"; }
  [[ -e "$out/g.svg" ]] && fail "a failed svg left a file"
fi
"$cnnflow" graph configs/fashion_mnist.yaml -o "$out/g.jpg" > "$out/log" 2>&1 && fail "-o g.jpg accepted"
grep -q "must end in .dot, .svg or .png" "$out/log" || { cat "$out/log"; fail "no message for g.jpg"; }
[[ -e "$out/g.jpg" ]] && fail "g.jpg was written"
echo "PASS: graph drawn per device"
