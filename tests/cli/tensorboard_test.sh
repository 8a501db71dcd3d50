#!/usr/bin/env bash
# TensorBoard event files: a short run with 2 replicas (so with ranks/*
# scalars) and one without a test set, read back by the tensorboard
# package's EventAccumulator (tensorboard_check.py): the tags, their steps,
# and values equal to metrics.csv's. Skips (77) when tensorboard is not
# importable.
#   usage: tensorboard_test.sh CNNFLOW_BINARY
set -u
cnnflow="$1"
source tests/cli/python_lib.sh
py=$(tools_python)
require_module "$py" tensorboard
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
common=(--set train.max_steps=30 --set train.log_every=10 --set threads=2)
"$cnnflow" train configs/fashion_mnist.yaml --set train.epochs=2 "${common[@]}" \
  --set "graph.devices=[cpu:0, cpu:1]" --out "$out/run" > "$out/log" 2>&1 ||
  { cat "$out/log"; fail "train exited with $?"; }
"$cnnflow" train configs/fashion_mnist.yaml --set train.epochs=1 "${common[@]}" \
  --set data.test=null --out "$out/notest" > "$out/log" 2>&1 ||
  { cat "$out/log"; fail "train (no test set) exited with $?"; }
ls "$out"/run/events.out.tfevents.* > /dev/null || fail "no event file in the run folder"
"$py" tests/cli/tensorboard_check.py "$out/run" 2 10,20,30,40,50,60 test ranks || fail "the run with a test set"
"$py" tests/cli/tensorboard_check.py "$out/notest" 1 10,20,30 notest || fail "the run without a test set"
echo "PASS: TensorBoard read back the scalars"
