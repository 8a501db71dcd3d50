"""Runs an ONNX file cnnflow exported in onnxruntime on the inputs of a
`cnnflow export --check` file and compares with cnnflow's logits.

usage: onnx_check.py MODEL.onnx CHECK.safetensors
"""
import sys

import numpy as np
import onnx
import onnxruntime as ort
from safetensors.numpy import load_file

model_path, check_path = sys.argv[1], sys.argv[2]
model = onnx.load(model_path)
onnx.checker.check_model(model, full_check=True)
assert model.opset_import[0].version == 17, model.opset_import
assert [i.name for i in model.graph.input] == ["input"], model.graph.input
assert [o.name for o in model.graph.output] == ["logits"], model.graph.output
ops = sorted({n.op_type for n in model.graph.node})

check = load_file(check_path)
x, want = check["input"], check["logits"]
scale = float(np.abs(want).max())
for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    sess = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
    got = sess.run(["logits"], {"input": x})[0]
    assert got.shape == want.shape, f"{got.shape} vs {want.shape}"
    err = float(np.abs(got - want).max()) / scale
    print(f"{model_path}: {len(x)} samples, onnxruntime {ort.__version__} ({level.name}): "
          f"max |onnx - cnnflow| / max |logit| = {err:.2e}, argmax agrees on "
          f"{int((got.argmax(1) == want.argmax(1)).sum())}/{len(x)}")
    assert err <= 1e-5, f"logits differ by {err:.2e} relative (> 1e-5)"
    # A batch of one: the batch dimension is symbolic.
    one = sess.run(["logits"], {"input": x[:1]})[0]
    assert np.abs(one - want[:1]).max() / scale <= 1e-5
print(f"ok: ops {', '.join(ops)}")
