#!/usr/bin/env bash
# cnnflow export: short trainings of every exportable layer type (2D on
# Fashion-MNIST, 1D on synthetic series) and of the main config, exported
# (from a RUN_DIR and from CONFIG --weights) and run in onnxruntime on the
# test images: logits equal cnnflow's to 1e-5 relative (onnx_check.py).
# Wrong arguments exit 2, a missing weights file 1, naming it. Skips (77)
# when onnxruntime is not importable.
#   usage: export_onnx_test.sh CNNFLOW_BINARY
set -u
cnnflow="$1"
source tests/cli/python_lib.sh
py=$(tools_python)
require_module "$py" onnxruntime
require_module "$py" safetensors
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
train() {  # CONFIG RUN_DIR [--set ...]
  local config=$1 run=$2
  shift 2
  "$cnnflow" train "$config" --set train.epochs=1 --set train.max_steps=20 --set threads=2 \
    --out "$run" "$@" > "$out/log" 2>&1 || { cat "$out/log"; fail "train $config exited with $?"; }
}
train tests/data/export_2d.yaml "$out/r2d"
"$cnnflow" export "$out/r2d" -o "$out/2d.onnx" --check 256 "$out/2d.check" ||
  fail "export of a run folder exited with $?"
"$py" tests/cli/onnx_check.py "$out/2d.onnx" "$out/2d.check" || fail "2D model"

train tests/data/export_spatial.yaml "$out/rsp"
"$cnnflow" export "$out/rsp" -o "$out/sp.onnx" --check 256 "$out/sp.check" ||
  fail "export of the spatial layers exited with $?"
"$py" tests/cli/onnx_check.py "$out/sp.onnx" "$out/sp.check" || fail "spatial layers"
# Adaptive pooling whose bins are not one AveragePool's windows: a clear error.
"$cnnflow" export tests/data/export_spatial.yaml --weights "$out/rsp/model.safetensors" \
  --set model.layers.3.adaptive_avgpool2d.out=5 -o "$out/bad.onnx" > "$out/log" 2>&1
rc=$?
[[ $rc -eq 1 ]] && grep -q "'pool1' (adaptive_avgpool2d) has no ONNX export for input 56x56" "$out/log" ||
  { cat "$out/log"; fail "non-dividing adaptive pool: exit $rc"; }

train tests/data/export_1d.yaml "$out/r1d"
"$cnnflow" export tests/data/export_1d.yaml --weights "$out/r1d/model.safetensors" \
  -o "$out/1d.onnx" --check 256 "$out/1d.check" || fail "export of a config exited with $?"
"$py" tests/cli/onnx_check.py "$out/1d.onnx" "$out/1d.check" || fail "1D model"

train configs/fashion_mnist.yaml "$out/main"
"$cnnflow" export "$out/main" -o "$out/main.onnx" --check 1000 "$out/main.check" ||
  fail "export of the main config exited with $?"
"$py" tests/cli/onnx_check.py "$out/main.onnx" "$out/main.check" || fail "main config"

"$cnnflow" export "$out/main" > "$out/log" 2>&1
rc=$?
[[ $rc -eq 2 ]] && grep -q "needs -o MODEL.onnx" "$out/log" || { cat "$out/log"; fail "no -o: exit $rc"; }
"$cnnflow" export configs/fashion_mnist.yaml --weights "$out/none.safetensors" -o "$out/x.onnx" \
  > "$out/log" 2>&1
rc=$?
[[ $rc -eq 1 ]] && grep -q "none.safetensors" "$out/log" || { cat "$out/log"; fail "missing weights: exit $rc"; }
[[ ! -e "$out/x.onnx" ]] || fail "a failed export left a file"
echo "PASS: ONNX round trip through onnxruntime"
