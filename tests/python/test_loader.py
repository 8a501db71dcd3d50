"""cnnflow.Loader: the batches of `cnnflow train`, determinism, DLPack,
errors, and a clean exit after an early break."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import cnnflow
from conftest import AUGMENT, NORMALIZE, read_safetensors, write_config


def lmdb_spec(data_dir):
    return {"source": "lmdb", "path": str(data_dir / "train.lmdb"), **AUGMENT}


def folder_spec(path):
    return {"source": "folder", "path": str(path), **AUGMENT}


def epoch(loader):
    return [(np.from_dlpack(x).copy(), np.from_dlpack(y).copy()) for x, y in loader]


def test_batches_equal_cnnflow_train(cli, data_dir, tmp_path):
    # The CLI trains 2 epochs and dumps every batch its model got.
    config = write_config(tmp_path / "run.yaml", lmdb_spec(data_dir), epochs=2, batch=8)
    dump = tmp_path / "dump"
    subprocess.run([cli, "train", config, "--dump-batches", str(dump), "--out",
                    str(tmp_path / "run")], check=True, capture_output=True)
    loader = cnnflow.Loader(config, threads=3)  # not the config's threads
    assert loader.batch_size == 8 and len(loader) == 8  # 60 samples
    for e in range(2):
        loader.set_epoch(e)
        batches = epoch(loader)
        assert len(batches) == len(loader)
        for i, (x, y) in enumerate(batches):
            want = read_safetensors(dump / f"batch-{e}-{i}.safetensors")
            assert x.shape == want["inputs"].shape and x.dtype == np.float32
            np.testing.assert_array_equal(x, want["inputs"])
            np.testing.assert_array_equal(y, want["labels"])
    # The config's values, overridden as --set does; a set it does not have.
    assert cnnflow.Loader(config, overrides=["train.batch=5"]).batch_size == 5
    with pytest.raises(cnnflow.ConfigError, match="no data.test set"):
        cnnflow.Loader(config, "test")
    # Augmented: the two epochs differ.
    assert not np.array_equal(read_safetensors(dump / "batch-0-0.safetensors")["inputs"],
                              read_safetensors(dump / "batch-1-0.safetensors")["inputs"])


def test_same_batches_whatever_the_threads(data_dir):
    spec = folder_spec(data_dir / "images")
    runs = [epoch(cnnflow.Loader(spec, batch=7, seed=3, threads=t, prefetch=p,
                                 transform=NORMALIZE))
            for t, p in ((1, 1), (2, 4), (4, 2))]
    for other in runs[1:]:
        assert len(other) == len(runs[0]) == 9  # ceil(60 / 7)
        for (x0, y0), (x1, y1) in zip(runs[0], other):
            np.testing.assert_array_equal(x0, x1)
            np.testing.assert_array_equal(y0, y1)


def test_epochs_reshuffle_and_set_epoch_repeats(data_dir):
    loader = cnnflow.Loader(lmdb_spec(data_dir), batch=60, seed=1, threads=2)
    first = epoch(loader)  # epoch 0
    second = epoch(loader)  # epoch 1: the next iteration
    assert not np.array_equal(first[0][1], second[0][1])
    assert sorted(first[0][1]) == sorted(second[0][1])  # the same samples, reordered
    loader.set_epoch(0)
    again = epoch(loader)
    np.testing.assert_array_equal(first[0][0], again[0][0])
    np.testing.assert_array_equal(first[0][1], again[0][1])


def test_len_drop_last_shards_and_no_shuffle(data_dir):
    spec = lmdb_spec(data_dir)
    assert len(cnnflow.Loader(spec, batch=8)) == 8
    assert len(cnnflow.Loader(spec, batch=8, drop_last=True)) == 7
    assert [len(np.from_dlpack(y)) for _, y in cnnflow.Loader(spec, batch=8, drop_last=True)] == [8] * 7
    # Two ranks: disjoint halves of the data set (padded shards of 30).
    shards = [np.concatenate([np.from_dlpack(y) for _, y in
                              cnnflow.Loader(spec, batch=8, rank=r, world=2, shuffle=False)])
              for r in (0, 1)]
    assert len(cnnflow.Loader(spec, batch=8, world=2)) == 4
    assert len(shards[0]) == len(shards[1]) == 30
    # The evaluation set ("test"): unshuffled, unaugmented, every sample once.
    test = cnnflow.Loader(spec, "test", batch=16)
    x = [np.from_dlpack(a).copy() for a, _ in test]
    assert len(test) == 4 and sum(len(a) for a in x) == 60
    np.testing.assert_array_equal(x[0], [np.from_dlpack(a) for a, _ in test][0])


def test_dlpack_shares_memory_and_holds_it(data_dir):
    loader = cnnflow.Loader(lmdb_spec(data_dir), batch=4, threads=2, prefetch=2)
    held, copies, later = [], [], []
    for i, (x, y) in enumerate(loader):
        assert x.__dlpack_device__() == (1, 0)  # kDLCPU
        a, labels = np.from_dlpack(x), np.from_dlpack(y)
        assert a.dtype == np.float32 and a.shape == (4, 3, 32, 32)
        assert labels.dtype == np.int64 and labels.shape == (4,)
        # No copy: numpy's array is the loader's buffer, as the buffer
        # protocol (a second way in) also shows.
        ptr = a.__array_interface__["data"][0]
        assert ptr == np.asarray(memoryview(x)).__array_interface__["data"][0]
        assert ptr == np.from_dlpack(x).__array_interface__["data"][0]
        if i < 5:
            held.append(a)  # kept past the next batches: must stay intact
            copies.append(a.copy())
        else:
            later.append(ptr)
    for a, c in zip(held, copies):
        np.testing.assert_array_equal(a, c)
    # A held batch's memory is not handed out again; released ones are.
    held_ptrs = {a.__array_interface__["data"][0] for a in held}
    assert len(held_ptrs) == 5 and not held_ptrs & set(later)
    assert len(set(later)) < len(later)
    # Released batches go back to the pool: the next epoch reuses a few buffers.
    del held, a, x
    reused = {np.from_dlpack(x).__array_interface__["data"][0] for x, _ in loader}
    assert len(reused) <= 8, reused


def test_errors_raise_with_cnnflows_messages(data_dir, tmp_path):
    with pytest.raises(cnnflow.ConfigError, match="unknown source 'lmbd'.*did you mean 'lmdb'"):
        cnnflow.Loader({"source": "lmbd", "path": "x"})
    with pytest.raises(cnnflow.ConfigError, match="data.train \\(lmdb\\).*unknown key 'hflp'"):
        cnnflow.Loader({"source": "lmdb", "path": "x", "hflp": True})
    with pytest.raises(cnnflow.Error, match="data.train \\(lmdb\\).*nothing.lmdb"):
        cnnflow.Loader({"source": "lmdb", "path": str(tmp_path / "nothing.lmdb")})
    with pytest.raises(cnnflow.ConfigError, match="batch must be > 0"):
        cnnflow.Loader(lmdb_spec(data_dir), batch=0)
    with pytest.raises(cnnflow.ConfigError, match="rank"):
        cnnflow.Loader(lmdb_spec(data_dir), rank=2, world=2)
    with pytest.raises(cnnflow.ConfigError, match="on_bad_record must be fail or skip"):
        cnnflow.Loader(lmdb_spec(data_dir), on_bad_record="ignore")
    with pytest.raises(cnnflow.ConfigError, match="no such|cannot|nope.yaml"):
        cnnflow.Loader(str(tmp_path / "nope.yaml"))
    with pytest.raises(TypeError, match="dict"):
        cnnflow.Loader(42)


def test_on_bad_record(data_dir, tmp_path):
    images = tmp_path / "images"
    import shutil
    shutil.copytree(data_dir / "images", images)
    bad = images / "cat" / "0.jpg"
    bad.write_bytes(bad.read_bytes()[:100])  # truncated
    spec = folder_spec(images)
    with pytest.raises(cnnflow.Error, match="bad record .*0.jpg.*on_bad_record: fail"):
        for _ in cnnflow.Loader(spec, batch=8):
            pass
    loader = cnnflow.Loader(spec, batch=8, on_bad_record="skip")
    assert sum(len(np.from_dlpack(y)) for _, y in loader) == 59
    assert len(loader.bad_records) == 1 and "0.jpg" in loader.bad_records[0]


def test_threads_released_when_the_loop_breaks(data_dir):
    def threads():
        return len(os.listdir("/proc/self/task"))

    loader = cnnflow.Loader(lmdb_spec(data_dir), batch=2, threads=2, prefetch=2)
    for _ in loader:  # a whole epoch: TBB's worker pool exists from now on
        pass
    before = threads()
    for _ in range(10):
        for x, y in loader:
            break
    # A thread kept per loop left would be 10 more (TBB may add a worker).
    assert threads() <= before + 1
    it = iter(loader)
    next(it)
    during = threads()
    assert during >= before + 1  # the epoch being loaded
    del it
    assert threads() == during - 1


def test_early_break_then_clean_exit(data_dir):
    # A loop left after one batch, another iterator left mid-epoch at exit:
    # the interpreter must exit at once, with no error.
    script = textwrap.dedent(f"""
        import numpy as np, cnnflow
        loader = cnnflow.Loader({lmdb_spec(data_dir)!r}, batch=2, threads=2, prefetch=2)
        for x, y in loader:
            break
        it = iter(loader)
        x, y = next(it)
        kept = np.from_dlpack(x)
        print("ok", kept.shape)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "ok (2, 3, 32, 32)" in r.stdout
    assert r.stderr == ""


def test_torch_from_dlpack_shares_memory(data_dir):
    # CI has no torch (this skips there); with torch, the tensor is the
    # loader's buffer, as numpy's array is.
    torch = pytest.importorskip("torch")
    for x, y in cnnflow.Loader(lmdb_spec(data_dir), batch=4, threads=2):
        t, labels = torch.from_dlpack(x), torch.from_dlpack(y)
        assert t.data_ptr() == np.from_dlpack(x).__array_interface__["data"][0]
        assert t.dtype == torch.float32 and labels.dtype == torch.int64
        assert torch.nn.functional.cross_entropy(torch.zeros(4, 10), labels).item() > 0
        break
