#!/usr/bin/env bash
# cnnflow import, end to end on the ONNX files torch.onnx wrote
# (tests/data/onnx/): each imports, and its model.yaml validates as written;
# predict runs it on a PNG; eval and predict take the weights with DDP's
# "module." prefix (the same predictions) and refuse a file that lacks a
# tensor, listing it; train starts from the imported weights; cnnflow
# export of the imported model runs in onnxruntime to PyTorch's logits.
# An ONNX op without a layer and a truncated file exit 1 naming them, and
# leave no folder. Skips (77) when onnxruntime is not importable.
#   usage: import_onnx_test.sh CNNFLOW_BINARY
set -u
cnnflow="$1"
source tests/cli/python_lib.sh
py=$(tools_python)
require_module "$py" onnxruntime
require_module "$py" safetensors
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run() {  # LOG COMMAND...: run it, or print the log and fail
  local log=$1
  shift
  "$@" > "$log" 2>&1 || { cat "$log"; fail "$* exited with $?"; }
}

for f in resnet_block inverted_residual_se_silu gelu_net zoo_net resnet_block_folded inverted_residual_se_silu_dynamo; do
  run "$out/log" "$cnnflow" import "tests/data/onnx/$f.onnx" -o "$out/$f"
  grep -q "wrote $out/$f/model.yaml" "$out/log" || { cat "$out/log"; fail "import $f said nothing"; }
  run "$out/log" "$cnnflow" validate "$out/$f/model.yaml"
done
m="$out/inverted_residual_se_silu"

# A 16x16 RGB PNG; the weights under DDP's names; a file without one tensor.
"$py" - "$out" "$m/model.safetensors" <<'PY' || fail "could not write the PNG or the weights"
import json, struct, sys, zlib
out, weights = sys.argv[1], sys.argv[2]
def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
raw = b''.join(b'\0' + bytes((r * 16 + c * 7 + k * 50) % 256 for c in range(16) for k in range(3))
               for r in range(16))
open(f'{out}/image.png', 'wb').write(
    b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 16, 16, 8, 2, 0, 0, 0)) +
    chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))
blob = open(weights, 'rb').read()
n = struct.unpack('<Q', blob[:8])[0]
header, data = json.loads(blob[8:8 + n]), blob[8 + n:]
def write(path, header):
    h = json.dumps(header).encode()
    h += b' ' * (-len(h) % 8)
    open(path, 'wb').write(struct.pack('<Q', len(h)) + h + data)
write(f'{out}/ddp.safetensors', {('module.' + k if k != '__metadata__' else k): v for k, v in header.items()})
write(f'{out}/short.safetensors', {k: v for k, v in header.items() if k != 'features.2.0.weight'})
PY
run "$out/plain.txt" "$cnnflow" predict "$m/model.yaml" --weights "$m/model.safetensors" "$out/image.png"
run "$out/ddp.txt" "$cnnflow" predict "$m/model.yaml" --weights "$out/ddp.safetensors" "$out/image.png"
diff <(grep png: "$out/plain.txt" | sed 's/   decode.*//') <(grep png: "$out/ddp.txt" | sed 's/   decode.*//') ||
  fail "predictions with 'module.' names differ"
run "$out/log" "$cnnflow" eval "$m/model.yaml" --weights "$out/ddp.safetensors"
"$cnnflow" eval "$m/model.yaml" --weights "$out/short.safetensors" > "$out/log" 2>&1
rc=$?
[[ $rc -eq 1 ]] && grep -q "the model's 'features.2.0.weight' \[16, 8, 1, 1\] is not in the file" "$out/log" ||
  { cat "$out/log"; fail "a file without a tensor: exit $rc"; }

# Training starts from the imported weights (train.init in model.yaml).
run "$out/log" "$cnnflow" train "$m/model.yaml" --set train.max_steps=3 --set threads=2 --out "$out/run"
grep -q "train.init: 31 tensors from $m/model.safetensors" "$out/log" ||
  { cat "$out/log"; fail "training did not start from the imported weights"; }

# Out again: cnnflow export of each imported model, run by onnxruntime on
# the fixture's input, gives PyTorch's logits.
for f in resnet_block inverted_residual_se_silu gelu_net zoo_net resnet_block_folded inverted_residual_se_silu_dynamo; do
  run "$out/log" "$cnnflow" export "$out/$f/model.yaml" --weights "$out/$f/model.safetensors" -o "$out/$f.onnx"
  "$py" - "$out/$f.onnx" "tests/data/onnx/$f.check.safetensors" <<'PY' || fail "$f: round trip"
import sys
import numpy as np
import onnxruntime as ort
from safetensors.numpy import load_file
ref = load_file(sys.argv[2])
x = ref["input"].astype(np.float32)
got = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
err = np.linalg.norm(got - ref["logits"]) / np.linalg.norm(ref["logits"])
print(f"{sys.argv[1]}: onnxruntime vs PyTorch {err:.1e}")
sys.exit(0 if err <= 1e-4 else 1)
PY
done

# An op without a layer: exit 1, the node and its op named, no folder.
"$py" - "$out/softplus.onnx" <<'PY' || fail "could not write softplus.onnx"
import sys
import onnx
from onnx import TensorProto, helper
g = helper.make_graph([helper.make_node("Softplus", ["x"], ["y"], name="/act/Softplus")], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 8, 8])])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), sys.argv[1])
PY
"$cnnflow" import "$out/softplus.onnx" -o "$out/softplus" > "$out/log" 2>&1
rc=$?
[[ $rc -eq 1 ]] && grep -q "node '/act/Softplus' (Softplus): no cnnflow layer for this op; the importer maps: Add," "$out/log" ||
  { cat "$out/log"; fail "an unknown op: exit $rc"; }
[[ ! -e "$out/softplus" ]] || fail "a failed import left $out/softplus"
head -c 5000 tests/data/onnx/resnet_block.onnx > "$out/cut.onnx"
"$cnnflow" import "$out/cut.onnx" -o "$out/cut" > "$out/log" 2>&1
rc=$?
[[ $rc -eq 1 ]] && grep -q "cut.onnx: not an ONNX model" "$out/log" || { cat "$out/log"; fail "a cut file: exit $rc"; }
[[ -z "$(ls -A "$out" | grep -e '^cut$' -e '\.tmp\.')" ]] || fail "a failed import left files: $(ls -A "$out")"
echo "PASS: ONNX files imported, predicted, evaluated with module. names, trained and exported again"
