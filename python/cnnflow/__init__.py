"""cnnflow for Python: its data loader and its trainer (docs/python.md).

cnnflow.Loader is a drop-in for torch.utils.data.DataLoader over cnnflow's
data sources; its batches are (images, labels) arrays with __dlpack__, so
torch.from_dlpack and numpy.from_dlpack take them without a copy.
cnnflow.Run trains a config as `cnnflow train` does.
"""

import atexit
import json
import os
import weakref

from ._cnnflow import ConfigError, Error, ShapeError
from . import _cnnflow

__all__ = ["Loader", "Run", "Error", "ConfigError", "ShapeError"]

# Epochs still loading and runs still training at exit (a loop left half
# done) stop before the interpreter goes, so that no thread of theirs
# outlives it.
_open_epochs = weakref.WeakSet()
_open_runs = weakref.WeakSet()


@atexit.register
def _close_all():
    for e in list(_open_epochs):
        e.close()
    for r in list(_open_runs):
        r.stop()


class Loader:
    """Batches of a cnnflow data set, as torch's DataLoader yields them.

    data: a data set's spec as a config's `data.train` holds it (a dict:
      {"source": "lmdb", "path": ..., ...}), or a config's path; then `name`
      picks data.train or data.test, `overrides` are `--set` assignments,
      and unset options take the config's values (train.batch or
      train.eval_batch, seed, threads, data.on_bad_record) and its
      data.transform.
    name: "train" (augmentation on, every rank's shard padded to the same
      size) or "test" (no augmentation, every sample once).
    batch, shuffle (default: name == "train"), seed, drop_last, threads
      (decode threads; default every core), prefetch (batches loaded ahead),
      rank and world (this process's shard, as DistributedSampler's),
      on_bad_record ("fail" or "skip"), transform (a dict's
      data.transform: [{"normalize": {"mean": [...], "std": [...]}}]).

    Iterating yields (images, labels): images float32 [N, C, H, W] (or
    [N, C, L]), labels int64 [N]. Each iteration is one epoch: the first
    is epoch 0 and each next one the following, unless set_epoch(e) said
    which. The same (seed, epoch) gives the same batches whatever `threads`.
    """

    def __init__(self, data, name="train", *, batch=None, shuffle=None, seed=None,
                 drop_last=False, threads=None, prefetch=4, rank=0, world=1,
                 on_bad_record=None, transform=None, overrides=()):
        a = _cnnflow._LoaderArgs()
        a.batch = -1 if batch is None else int(batch)
        a.shuffle = -1 if shuffle is None else int(bool(shuffle))
        a.seed = -1 if seed is None else int(seed)
        a.drop_last = bool(drop_last)
        a.threads = -1 if threads is None else int(threads)
        a.prefetch = int(prefetch)
        a.rank, a.world = int(rank), int(world)
        a.on_bad_record = on_bad_record or ""
        if isinstance(data, dict):
            section = {"train": data}
            if name == "test":
                section["test"] = data
            if transform is not None:
                section["transform"] = transform
            text = json.dumps({"data": section}, default=os.fspath)
            self._impl = _cnnflow._Loader.from_spec(text, name, a)
        elif isinstance(data, (str, os.PathLike)):
            if transform is not None:
                raise ConfigError("transform= goes with a data spec; a config has data.transform")
            self._impl = _cnnflow._Loader.from_config(os.fspath(data), name,
                                                      [str(o) for o in overrides], a)
        else:
            raise TypeError(f"cnnflow.Loader: data is a dict (a data set's spec) or a config "
                            f"path, not {type(data).__name__}")

    def __len__(self):
        """Batches per epoch on this rank (as DataLoader's len)."""
        return len(self._impl)

    def __iter__(self):
        e = self._impl.start(self._impl.epoch)
        self._impl.epoch += 1
        _open_epochs.add(e)
        return e

    def set_epoch(self, epoch):
        """The epoch the next iteration loads (DistributedSampler's set_epoch)."""
        self._impl.epoch = int(epoch)

    @property
    def batch_size(self):
        return self._impl.batch

    @property
    def bad_records(self):
        """Records the last iteration skipped (on_bad_record="skip"): "key (sample i): error"."""
        return list(self._impl.bad_records)

    @property
    def sample_shape(self):
        return tuple(self._impl.sample_shape)

    @property
    def num_classes(self):
        return self._impl.num_classes

    @property
    def dataset_size(self):
        return self._impl.num_samples

    def torch(self):
        """One epoch as torch tensors (torch.from_dlpack on each batch; no copy)."""
        import torch
        for x, y in self:
            yield torch.from_dlpack(x), torch.from_dlpack(y)


class Run:
    """A config trained as `cnnflow train` trains it.

    Run(config, overrides=["train.epochs=2"]): builds the model and opens
    the data (config errors and shape errors raise here).
    fit() trains, yielding a dict of metrics after each epoch (and every N
    steps with every_steps=N); it writes the
    run folder (run_dir) as the command line does. Ctrl-C stops after the
    step in flight, writes the checkpoint, then raises KeyboardInterrupt.
    """

    def __init__(self, config, overrides=(), *, verbose=False):
        self._impl = _cnnflow._Run(os.fspath(config), [str(o) for o in overrides], bool(verbose))
        _open_runs.add(self._impl)

    def fit(self, run_dir=None, every_steps=0):
        """Trains; yields each epoch's report ({"epoch", "lr", "train_loss",
        "train_accuracy", "train_images_per_s", "test_loss", "test_accuracy"})
        and, with every_steps=N, a report of the last N training batches
        ({"epoch", "step", "loss", "accuracy", "samples"}: this process's
        batches, step counting optimizer steps) every N batches."""
        self._impl.start(os.fspath(run_dir) if run_dir else "", int(every_steps))
        try:
            while True:
                report = self._impl.next_epoch()
                if report is None:
                    return
                yield report
        finally:
            # A loop that breaks stops training after the step in flight.
            self._impl.stop()

    def evaluate(self):
        """One pass over data.test: {"loss", "accuracy", "samples", ...}."""
        return self._impl.evaluate()

    def state_dict(self):
        """A snapshot of the weights and buffers under PyTorch's names (those
        of model.safetensors), each an array with __dlpack__."""
        return self._impl.state_dict()

    def load_state_dict(self, state_dict, strict=True):
        """Loads arrays (numpy, torch, anything with __dlpack__) by name."""
        self._impl.load_state_dict(dict(state_dict), bool(strict))

    def export_onnx(self, path):
        """The model with its current weights as ONNX (opset 17), as `cnnflow export`."""
        self._impl.export_onnx(os.fspath(path))

    @property
    def run_dir(self):
        return self._impl.run_dir

    @property
    def global_step(self):
        return self._impl.global_step

    @property
    def steps_per_epoch(self):
        return self._impl.steps_per_epoch
