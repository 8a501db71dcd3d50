"""cnnflow beside PyTorch in one process: `import cnnflow` and `import torch`
work in either order, torch then runs on the CUDA libraries it loads alone
(one copy of each), and cnnflow still trains and hands torch its tensors.
Each order runs in a fresh interpreter. Skips where torch is not installed
(as in CI, whose venv has NumPy only)."""

import importlib.util
import json
import subprocess
import sys

import pytest

from conftest import AUGMENT, write_config

if importlib.util.find_spec("torch") is None:
    pytest.skip("torch is not installed in this Python environment (the import-order tests "
                "need it; pip install torch to run them)", allow_module_level=True)

# Imports the modules in the order given, then reports what torch sees: its
# cuDNN and NCCL versions, and the file behind each CUDA library's soname.
PROBE = r"""
import json, re, sys
for name in sys.argv[1].split(","):
    __import__(name)
import torch
report = {"cuda": torch.version.cuda, "available": torch.cuda.is_available()}
if torch.version.cuda:
    report["cudnn"] = torch.backends.cudnn.version()  # raises where cuDNN is older than torch's
    report["nccl"] = list(torch.cuda.nccl.version())
libs = {}
for line in open("/proc/self/maps"):
    path = line.split()[-1]
    m = re.fullmatch(r".*/(lib(?:nccl|cudnn|cudart|cublas|cublasLt)\.so\.\d+)", path)
    if m:
        libs.setdefault(m.group(1), set()).add(path)
report["libs"] = {k: sorted(v) for k, v in libs.items()}
if len(sys.argv) > 2:
    import cnnflow
    run = cnnflow.Run(sys.argv[2])
    report["epochs"] = len([m for m in run.fit() if "step" not in m])
    weights = [torch.from_dlpack(v) for v in run.state_dict().values()]
    report["finite"] = all(bool(torch.isfinite(w).all()) for w in weights
                           if w.is_floating_point())
print(json.dumps(report))
"""


def probe(order, config=None):
    args = [sys.executable, "-c", PROBE, order] + ([config] if config else [])
    p = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"import {order}: exit {p.returncode}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def torch_alone():
    return probe("torch")


@pytest.mark.parametrize("order", ["cnnflow,torch", "torch,cnnflow"])
def test_cnnflow_and_torch_in_either_order(order, torch_alone, data_dir, tmp_path):
    lmdb = {"source": "lmdb", "path": str(data_dir / "train.lmdb")}
    config = write_config(tmp_path / "run.yaml", {**lmdb, **AUGMENT}, epochs=1, batch=8)
    got = probe(order, config)
    # torch loads the libraries it loads alone, and only those: one file per soname.
    for soname, paths in got["libs"].items():
        assert len(paths) == 1, f"import {order}: {soname} loaded twice: {paths}"
    for soname, paths in torch_alone["libs"].items():
        assert got["libs"].get(soname) == paths, f"import {order}: torch's {soname}"
    for key in ("cuda", "available", "cudnn", "nccl"):
        assert got.get(key) == torch_alone.get(key), f"import {order}: {key}"
    assert got["epochs"] == 1 and got["finite"]
