#!/usr/bin/env bash
# A pipeline names its bottleneck stage (pipeline/rank_times.h FindSlowStage):
# the Fashion-MNIST pipeline cut by hand so that stage 0 holds every layer
# but fc2 is several times busier than stage 1, and training says so
# ("stage 0 (conv1 .. relu3) is the bottleneck: ..."); its automatic,
# FLOP-balanced cut prints the idle shares.
#   usage: pipeline_bottleneck_test.sh CNNFLOW_BINARY
set -u
cnnflow="$1"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run=(train configs/fashion_mnist_pipeline.yaml --set train.epochs=1 --set train.max_steps=40
     --set train.eval_max_steps=1)
"$cnnflow" "${run[@]}" --out "$out/lopsided" \
  --set 'graph.pipeline.stages=[[conv1, relu1, pool1, conv2, relu2, pool2, flatten, fc1, relu3], [fc2]]' \
  > "$out/lopsided.log" 2>&1 || { cat "$out/lopsided.log"; fail "training exited with $?"; }
grep "^pipeline: " "$out/lopsided.log"
grep -q "^pipeline: 2 stages, 4 micro-batches (1f1b): idle share per stage" "$out/lopsided.log" ||
  fail "no idle shares"
grep -q "^pipeline: stage 0 (conv1 .. relu3) is the bottleneck: busy [0-9.]*x the other stage's ([0-9.]* vs [0-9.]* ms per step); move layers out of it in graph.pipeline" \
  "$out/lopsided.log" || fail "the lopsided cut's stage 0 was not named the bottleneck"
echo "PASS: the busiest stage was named"
