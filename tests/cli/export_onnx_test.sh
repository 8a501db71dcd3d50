#!/usr/bin/env bash
# cnnflow export: short trainings of every exportable layer type (2D on
# Fashion-MNIST, 1D on synthetic series; issue 29's layers in
# export_blocks*.yaml) and of the main config, exported
# (from a RUN_DIR and from CONFIG --weights) and run in onnxruntime on the
# test images: logits equal cnnflow's to 1e-5 relative (onnx_check.py); and
# the library networks of tests/data/library exported with PyTorch's weights:
# onnxruntime's logits equal PyTorch's to 1e-4 (norm-relative).
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

train tests/data/export_blocks.yaml "$out/rblocks"
"$cnnflow" export "$out/rblocks" -o "$out/blocks.onnx" --check 256 "$out/blocks.check" ||
  fail "export of the blocks model exited with $?"
"$py" tests/cli/onnx_check.py "$out/blocks.onnx" "$out/blocks.check" || fail "blocks model"
train tests/data/export_blocks_1d.yaml "$out/rblocks1d"
"$cnnflow" export "$out/rblocks1d" -o "$out/blocks1d.onnx" --check 256 "$out/blocks1d.check" ||
  fail "export of the 1D blocks model exited with $?"
"$py" tests/cli/onnx_check.py "$out/blocks1d.onnx" "$out/blocks1d.check" || fail "1D blocks model"

train configs/fashion_mnist.yaml "$out/main"
"$cnnflow" export "$out/main" -o "$out/main.onnx" --check 1000 "$out/main.check" ||
  fail "export of the main config exited with $?"
"$py" tests/cli/onnx_check.py "$out/main.onnx" "$out/main.check" || fail "main config"

# The library networks of tests/data/library (PyTorch's weights, input and
# logits): exported with PyTorch's weights, onnxruntime gives PyTorch's logits.
for fixture in tests/data/library/*.safetensors; do
  name=$(basename "$fixture" .safetensors)
  # The config, and the weights alone (export reads weights strictly).
  "$py" - "$fixture" "$out/$name.yaml" "$out/$name.weights.safetensors" <<'PY' || fail "$name: no config"
import sys
from safetensors import safe_open
from safetensors.numpy import save_file
with safe_open(sys.argv[1], "np") as f:
    meta, shape = f.metadata(), list(f.get_tensor("input").shape[1:])
    save_file({k: f.get_tensor(k) for k in f.keys() if k not in ("input", "logits", "logits_train")}, sys.argv[3])
options = meta["with"].split(";")
opts = ", ".join(o.replace("=", ": ") for o in options if not o.startswith("input="))
open(sys.argv[2], "w").write(
    f"name: {meta['model']}\ndata:\n  train: {{source: synthetic, shape: {shape}, size: 4}}\n"
    f"model: {{library: {meta['model']}, input: {shape}, with: {{{opts}}}}}\n"
    "train: {epochs: 1, batch: 2, optimizer: {sgd: {lr: 0.1}}}\n")
PY
  "$cnnflow" export "$out/$name.yaml" --weights "$out/$name.weights.safetensors" -o "$out/$name.onnx" > "$out/log" 2>&1
  rc=$?
  [[ $rc -eq 0 ]] || { cat "$out/log"; fail "export of library network $name exited with $rc"; }
  "$py" - "$out/$name.onnx" "$fixture" <<'PY' || fail "library network $name in onnxruntime"
import sys
import numpy as np
import onnxruntime as ort
from safetensors.numpy import load_file
t = load_file(sys.argv[2])
y = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"]).run(
    None, {"input": t["input"].astype(np.float32)})[0]
err = np.linalg.norm(y - t["logits"]) / np.linalg.norm(t["logits"])
print(f"{sys.argv[2]}: onnxruntime vs PyTorch logits {err:.2e}")
sys.exit(0 if err <= 1e-4 else 1)
PY
done

"$cnnflow" export "$out/main" > "$out/log" 2>&1
rc=$?
[[ $rc -eq 2 ]] && grep -q "needs -o MODEL.onnx" "$out/log" || { cat "$out/log"; fail "no -o: exit $rc"; }
"$cnnflow" export configs/fashion_mnist.yaml --weights "$out/none.safetensors" -o "$out/x.onnx" \
  > "$out/log" 2>&1
rc=$?
[[ $rc -eq 1 ]] && grep -q "none.safetensors" "$out/log" || { cat "$out/log"; fail "missing weights: exit $rc"; }
[[ ! -e "$out/x.onnx" ]] || fail "a failed export left a file"
echo "PASS: ONNX round trip through onnxruntime"
