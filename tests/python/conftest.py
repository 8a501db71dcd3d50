"""Fixtures of the Python package's tests: the cnnflow CLI (to compare with)
and small data sets made at run time from the JPEG sample in tests/data."""

import json
import os
import shutil
import subprocess
import struct
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "data" / "cifar10-jpeg-sample"  # 10 classes x 2 JPEGs, 32x32


@pytest.fixture(scope="session")
def cli():
    """The cnnflow binary of the build under test ($CNNFLOW_BIN)."""
    path = os.environ.get("CNNFLOW_BIN", str(ROOT / "build" / "cnnflow"))
    if not os.access(path, os.X_OK):
        pytest.fail(f"no cnnflow binary at {path} (set CNNFLOW_BIN)")
    return path


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory, cli):
    """The JPEG sample, copied 3 times (60 images), and as an LMDB."""
    d = tmp_path_factory.mktemp("data")
    images = d / "images"
    for cls in sorted(p.name for p in SAMPLE.iterdir()):
        (images / cls).mkdir(parents=True)
        for i, f in enumerate(sorted((SAMPLE / cls).iterdir()) * 3):
            shutil.copy(f, images / cls / f"{i}{f.suffix}")
    subprocess.run([cli, "convert", "--from", "folder", str(images), "--to", str(d / "train.lmdb"),
                    "--shuffle"], check=True, capture_output=True)
    return d


AUGMENT = {"shape": [3, 32, 32], "pad": 4, "random_crop": True, "hflip": True}
NORMALIZE = [{"normalize": {"mean": [0.49, 0.48, 0.45], "std": [0.25, 0.24, 0.26]}}]


def write_config(path, train, epochs=1, batch=8, threads=2, test=None):
    """A small run: the data set given and a 2-layer CNN (JSON is YAML)."""
    data = {"train": train, "transform": NORMALIZE}
    if test:
        data["test"] = test
    config = {
        "name": "python-test", "seed": 7, "threads": threads, "data": data,
        "model": {"input": [3, 32, 32], "layers": [
            {"name": "conv1", "conv2d": {"out": 8, "kernel": 3, "pad": 1}},
            {"name": "bn1", "batchnorm": {}},
            {"name": "relu1", "relu": {}},
            {"name": "pool1", "maxpool2d": {"kernel": 4}},
            {"name": "flatten", "flatten": {}},
            {"name": "fc", "linear": {"out": 10}}]},
        "train": {"epochs": epochs, "batch": batch,
                  "optimizer": {"sgd": {"lr": 0.05, "momentum": 0.9}}},
        "graph": {"template": "graphs/data_parallel.yaml", "devices": ["cpu:0"]},
        "output": {"dir": str(Path(path).parent / "runs")},
    }
    Path(path).write_text(json.dumps(config))
    return str(path)


def read_safetensors(path):
    """{name: array} of a safetensors file, read with NumPy alone."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    types = {"F32": np.float32, "F64": np.float64, "I64": np.int64}
    out = {}
    for name, h in header.items():
        begin, end = h["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + begin:8 + n + end],
                                  dtype=types[h["dtype"]]).reshape(h["shape"])
    return out


def safetensors_names(path):
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return [k for k in json.loads(raw[8:8 + n]) if k != "__metadata__"]
