#!/usr/bin/python3
"""PyTorch's loader on cnnflow's LMDB: DataLoader + PIL, images/s.

The peer for bench/loader_bench.cc (bench/loader_vs_pytorch.sh runs both).
Reads the JPEG bytes of the first --records records of an LMDB written by
`cnnflow convert --encoded` (python3-lmdb), decodes them with PIL and applies
the training augmentation torchvision would:

  cifar: RandomCrop(32, padding=4), RandomHorizontalFlip(), ToTensor(), Normalize
  photo: RandomCrop(224), RandomHorizontalFlip(), ToTensor(), Normalize
  photo_resize: Resize(256) (bilinear, the short side), then as photo

torchvision is not installed on this machine (Debian 12's python3-torch has
no torchvision), so the transforms are written here with PIL + torch ops,
the way torchvision 0.14 does them for PIL images: pad (ImageOps.expand with
fill 0), PIL crop, PIL transpose, then np.array -> torch tensor, permute to
CHW, float / 255, clone, then sub_/div_ by mean/std.

Prints one machine-readable line per figure:
  pytorch_pil_decode images_per_s=...      (PIL decode only, 1 thread, no DataLoader)
  pytorch_pil_transform images_per_s=...   (decode + transforms, 1 thread, no DataLoader)
  pytorch_loader num_workers=W images_per_s=... cpu_cores=... (main process + workers)

Run with Debian's interpreter (the `python3` on PATH is a pyenv Python
without torch):
  /usr/bin/python3 bench/pytorch_loader.py --lmdb data/cifar10-train.lmdb --preset cifar
"""

import argparse
import io
import os
import resource
import statistics
import struct
import sys
import time

import lmdb
import numpy as np
import torch
from PIL import Image, ImageOps

PRESETS = {
    # crop, padding, mean, std, resize (the short side; 0: none)
    "cifar": (32, 4, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), 0),
    "photo": (224, 0, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), 0),
    "photo_resize": (224, 0, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), 256),
}


def parse_record(value):
    """cnnflow's record layout (loaders/record.h) -> (label, payload bytes).

    0: magic "CFR1", 4: version, 5: encoding (1 = JPEG), 6: dtype, 7: rank R,
    8: int64 label, 16: uint64 payload size, 24: R int64 dims, then payload.
    """
    if len(value) < 24 or bytes(value[:4]) != b"CFR1":
        raise ValueError("not a cnnflow record (no CFR1 magic)")
    encoding, rank = value[5], value[7]
    label, size = struct.unpack_from("<qQ", value, 8)
    start = 24 + 8 * rank
    if encoding != 1:
        raise ValueError(f"record encoding {encoding} is not JPEG (1)")
    if start + size != len(value):
        raise ValueError(f"record holds {len(value)} bytes, header says {start + size}")
    return label, bytes(value[start:start + size])


class Transform:
    """[Resize(resize)] + RandomCrop(size, padding) + RandomHorizontalFlip +
    ToTensor + Normalize."""

    def __init__(self, size, padding, mean, std, resize=0):
        self.size, self.padding, self.resize = size, padding, resize
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, img):
        if self.resize > 0:  # torchvision's Resize(int): the short side, long = int(long * r / short)
            w, h = img.size
            size = (self.resize, int(h * self.resize / w)) if w <= h else (int(w * self.resize / h), self.resize)
            img = img.resize(size, Image.BILINEAR)
        if self.padding > 0:
            img = ImageOps.expand(img, border=self.padding, fill=0)
        w, h = img.size
        top = int(torch.randint(0, h - self.size + 1, size=(1,)).item())
        left = int(torch.randint(0, w - self.size + 1, size=(1,)).item())
        img = img.crop((left, top, left + self.size, top + self.size))
        if torch.rand(1) < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        t = torch.from_numpy(np.array(img, np.uint8, copy=True))
        t = t.view(img.size[1], img.size[0], 3).permute(2, 0, 1).contiguous()
        t = t.to(dtype=torch.get_default_dtype()).div(255)
        return t.clone().sub_(self.mean).div_(self.std)  # Normalize(inplace=False) clones


def decode(jpeg):
    return Image.open(io.BytesIO(jpeg)).convert("RGB")


class LmdbJpegDataset(torch.utils.data.Dataset):
    """Records by key; the LMDB is opened lazily, once per worker process."""

    def __init__(self, path, keys, transform):
        self.path, self.keys, self.transform = path, keys, transform
        self.txn = None

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        if self.txn is None:
            env = lmdb.open(self.path, readonly=True, lock=False, readahead=False,
                            subdir=os.path.isdir(self.path))
            self.txn = env.begin(buffers=True)
        label, jpeg = parse_record(self.txn.get(self.keys[i]))
        return self.transform(decode(jpeg)), label


class RepeatedShuffle(torch.utils.data.Sampler):
    """Fresh permutations back to back, `total` indices: one long pass, so
    workers start once (not once per epoch of a small set)."""

    def __init__(self, n, total, seed):
        self.n, self.total, self.seed = n, total, seed

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        left = self.total
        while left > 0:
            perm = torch.randperm(self.n, generator=g)[:left].tolist()
            left -= len(perm)
            yield from perm

    def __len__(self):
        return self.total


def first_keys(path, n):
    env = lmdb.open(path, readonly=True, lock=False, subdir=os.path.isdir(path))
    keys = []
    with env.begin() as txn:
        for k in txn.cursor().iternext(keys=True, values=False):
            keys.append(bytes(k))
            if len(keys) == n > 0:
                break
    env.close()
    if not keys:
        sys.exit(f"pytorch_loader: {path} holds no records")
    return keys


def single_thread(path, keys, transform, reps):
    """Decode only, and decode + transform, in a plain loop (no DataLoader),
    on one thread (torch's intra-op threads too)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    env = lmdb.open(path, readonly=True, lock=False, subdir=os.path.isdir(path))
    with env.begin() as txn:
        jpegs = [parse_record(txn.get(k))[1] for k in keys]
    env.close()
    for name, fn in (("pytorch_pil_decode", lambda j: decode(j).load()),
                     ("pytorch_pil_transform", lambda j: transform(decode(j)))):
        rates = []
        for rep in range(reps + 1):  # rep 0 warms up, untimed
            t0 = time.perf_counter()
            for j in jpegs:
                fn(j)
            if rep > 0:
                rates.append(len(jpegs) / (time.perf_counter() - t0))
        print(f"{name} images_per_s={statistics.median(rates):.0f} best={max(rates):.0f} "
              f"records={len(jpegs)} runs={','.join(str(int(r)) for r in rates)}", flush=True)
    torch.set_num_threads(threads)


def cpu_seconds():
    """CPU time of this process and its reaped children (the workers)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def loader_rate(path, keys, transform, workers, batch, steps, warmup, seed, max_seconds):
    """images/s over `steps` batches after `warmup`, and the CPU cores used
    from the DataLoader's start to its workers' exit."""
    start, cpu0 = time.perf_counter(), cpu_seconds()
    ds = LmdbJpegDataset(path, keys, transform)
    sampler = RepeatedShuffle(len(keys), (warmup + steps) * batch, seed)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers,
                                     drop_last=True)
    it = iter(dl)
    for _ in range(warmup):  # worker start-up and the first batches, untimed
        next(it)
    t0 = time.perf_counter()
    c0 = time.process_time()
    images = batches = 0
    while batches < steps and (batches < 3 or time.perf_counter() - t0 < max_seconds):
        x, _y = next(it)
        images += x.shape[0]
        batches += 1
    seconds = time.perf_counter() - t0
    main_cpu = time.process_time() - c0
    del it  # the last reference: its __del__ joins the workers, so their CPU time is counted
    cores = (cpu_seconds() - cpu0) / (time.perf_counter() - start)
    return images / seconds, seconds, main_cpu, cores, batches


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lmdb", required=True, help="LMDB of cnnflow records holding JPEGs")
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    ap.add_argument("--records", type=int, default=0,
                    help="the DataLoader samples the first N records (0: all)")
    ap.add_argument("--single-records", type=int, default=0,
                    help="the single-thread rows use the first N records (0: as --records)")
    ap.add_argument("--workers", default="0,1,2", help="num_workers values, comma-separated")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=50, help="timed batches per setting")
    ap.add_argument("--max-seconds", type=float, default=1e9,
                    help="end a setting's timed loop after this long (at least 3 batches)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed batches first")
    ap.add_argument("--reps", type=int, default=1,
                    help="rounds over the settings, alternating; the median counts")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads in the main process")
    ap.add_argument("--no-single", action="store_true", help="skip the single-thread rows")
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    transform = Transform(*PRESETS[a.preset])
    keys = first_keys(a.lmdb, a.records)
    print(f"pytorch {torch.__version__} PIL {Image.__version__} records={len(keys)} "
          f"preset={a.preset} batch={a.batch} threads={a.threads}", flush=True)
    if not a.no_single:
        single_thread(a.lmdb, keys[:a.single_records or len(keys)], transform, max(1, a.reps))
    workers = [int(w) for w in a.workers.split(",")]
    runs = {w: [] for w in workers}
    for rep in range(a.reps):
        for w in workers:
            runs[w].append(loader_rate(a.lmdb, keys, transform, w, a.batch, a.steps, a.warmup,
                                       a.seed + rep, a.max_seconds))
    for w in workers:
        rates = [r[0] for r in runs[w]]
        print(f"pytorch_loader num_workers={w} images_per_s={statistics.median(rates):.0f} "
              f"best={max(rates):.0f} batches={min(r[4] for r in runs[w])} batch={a.batch} "
              f"seconds={statistics.median(r[1] for r in runs[w]):.2f} "
              f"main_cpu_s={statistics.median(r[2] for r in runs[w]):.2f} "
              f"cpu_cores={statistics.median(r[3] for r in runs[w]):.2f} "
              f"runs={','.join(str(int(r)) for r in rates)}", flush=True)


if __name__ == "__main__":
    main()
