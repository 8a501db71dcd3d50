"""cnnflow.Run: fit, evaluate, state_dict under model.safetensors' names,
load_state_dict, export_onnx, and Ctrl-C."""

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import cnnflow
from conftest import AUGMENT, read_safetensors, safetensors_names, write_config


@pytest.fixture
def config(data_dir, tmp_path):
    lmdb = {"source": "lmdb", "path": str(data_dir / "train.lmdb")}
    return write_config(tmp_path / "run.yaml", {**lmdb, **AUGMENT}, epochs=2, batch=8,
                        test={**lmdb, "shape": [3, 32, 32]})


def test_fit_evaluate_and_state_dict(config, tmp_path):
    run = cnnflow.Run(config, overrides=["train.optimizer.sgd.lr=0.02"])
    reports = list(run.fit(run_dir=tmp_path / "run"))
    assert [r["epoch"] for r in reports] == [1, 2]
    for r in reports:
        assert np.isfinite(r["train_loss"]) and 0 <= r["test_accuracy"] <= 1
        assert r["train_images_per_s"] > 0
    assert run.global_step == 2 * 8  # 60 samples, batch 8
    assert run.run_dir == str(tmp_path / "run")
    saved = Path(run.run_dir) / "model.safetensors"
    # The state dict: model.safetensors' tensors, same names, same values.
    state = run.state_dict()
    assert sorted(state) == sorted(safetensors_names(saved))
    assert "conv1.weight" in state and "bn1.running_mean" in state
    on_disk = read_safetensors(saved)
    for name, t in state.items():
        np.testing.assert_array_equal(np.from_dlpack(t), on_disk[name])
    m = run.evaluate()
    assert m["samples"] == 60 and abs(m["accuracy"] - reports[-1]["test_accuracy"]) < 1e-9


def test_fit_every_steps(config, tmp_path):
    run = cnnflow.Run(config)
    reports = list(run.fit(run_dir=tmp_path / "run", every_steps=3))
    steps = [r for r in reports if "step" in r]
    epochs = [r for r in reports if "train_loss" in r]
    assert [r["epoch"] for r in epochs] == [1, 2]
    # 8 batches per epoch, 16 in all: a window after steps 3, 6, ..., 15.
    assert [r["step"] for r in steps] == [3, 6, 9, 12, 15]
    assert [r["epoch"] for r in steps] == [1, 1, 2, 2, 2]
    for r in steps:
        assert r["samples"] > 0 and np.isfinite(r["loss"]) and 0 <= r["accuracy"] <= 1
    # The windows come in order with the epochs: epoch 1's report after step 6's window.
    assert reports.index(epochs[0]) == 2
    with pytest.raises(cnnflow.Error, match="every_steps"):
        next(cnnflow.Run(config).fit(every_steps=-1))


def test_state_dict_is_a_snapshot_and_loads_back(config):
    run = cnnflow.Run(config)
    before = {k: np.from_dlpack(v).copy() for k, v in run.state_dict().items()}
    snapshot = run.state_dict()
    changed = dict(before)
    changed["fc.weight"] = np.zeros_like(before["fc.weight"])
    run.load_state_dict(changed)
    np.testing.assert_array_equal(np.from_dlpack(run.state_dict()["fc.weight"]), 0)
    np.testing.assert_array_equal(np.from_dlpack(snapshot["fc.weight"]), before["fc.weight"])
    run.load_state_dict(before)
    np.testing.assert_array_equal(np.from_dlpack(run.state_dict()["fc.weight"]),
                                  before["fc.weight"])
    wrong = dict(before)
    wrong["fc.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(cnnflow.Error, match="fc.weight"):
        run.load_state_dict(wrong)
    del wrong["fc.weight"]
    with pytest.raises(cnnflow.Error, match="fc.weight"):
        run.load_state_dict(wrong)
    run.load_state_dict(wrong, strict=False)


def test_export_onnx(config, tmp_path):
    run = cnnflow.Run(config)
    # The live weights go out, not a copy from before: conv1's, changed here.
    state = {k: np.from_dlpack(v).copy() for k, v in run.state_dict().items()}
    state["conv1.weight"] = np.linspace(-1, 1, state["conv1.weight"].size,
                                        dtype=np.float32).reshape(state["conv1.weight"].shape)
    run.load_state_dict(state)
    run.export_onnx(tmp_path / "model.onnx")
    raw = (tmp_path / "model.onnx").read_bytes()
    assert len(raw) > 10000 and b"conv1.weight" in raw
    assert state["conv1.weight"].tobytes() in raw
    # An error is an exception with the message, nothing on stderr to read.
    with pytest.raises(cnnflow.Error, match="no-such-folder"):
        run.export_onnx(tmp_path / "no-such-folder" / "model.onnx")


def test_config_errors(tmp_path, config):
    with pytest.raises(cnnflow.ConfigError, match="unknown key 'epochz'.*did you mean 'epochs'"):
        cnnflow.Run(config, overrides=["train.epochz=1"])
    with pytest.raises(cnnflow.ShapeError, match="model.input"):
        cnnflow.Run(config, overrides=["model.input=[3, 28, 28]"])


def test_ctrl_c_stops_after_the_step_and_checkpoints(config, tmp_path):
    script = textwrap.dedent(f"""
        import sys, cnnflow
        run = cnnflow.Run({config!r}, overrides=["train.epochs=200"])
        try:
            for report in run.fit(run_dir={str(tmp_path / 'run')!r}):
                print("epoch", report["epoch"], flush=True)
        except KeyboardInterrupt:
            print("interrupted at step", run.global_step, flush=True)
            sys.exit(3)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith("epoch 1")
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3, err
    step = int(out.split("interrupted at step")[1])
    assert 8 <= step < 200 * 8
    checkpoints = list((tmp_path / "run" / "checkpoints").iterdir())
    # checkpoints/step-<N>.safetensors: one at the step it stopped after.
    steps = {int(c.name.split("-")[1].split(".")[0]) for c in checkpoints}
    assert step in steps, (step, checkpoints)
