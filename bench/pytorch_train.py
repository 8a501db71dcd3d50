#!/usr/bin/python3
"""PyTorch reference for cnnflow's training benchmark (issue 2).

Trains the "two-layer CNN + FC" of configs/fashion_mnist.yaml on the real
Fashion-MNIST with Debian's CPU PyTorch, fed the fastest way PyTorch allows:
the whole set normalised once into one float tensor, shuffled batches sliced
from it with index_select (no DataLoader, no worker processes).

Run it with Debian's interpreter, which has torch:
    /usr/bin/python3 bench/pytorch_train.py --threads 2 --steps 300
    /usr/bin/python3 bench/pytorch_train.py --threads 2 --epochs 10   # accuracy

Throughput mode (default): --warmup W untimed steps, then --steps S timed
steps; prints one line
    pytorch images_per_s=... threads=... steps=... batch=... setting=... ...
Accuracy mode (--epochs E > 0): E full epochs, test accuracy after each.

Settings (the "best setting" search of bench/README.md):
    --openblas-threads N   sets OPENBLAS_NUM_THREADS before torch is imported
    --mkldnn on|off        torch.backends.mkldnn.enabled (oneDNN convolutions)
    --channels-last        model and input in torch.channels_last
    --foreach              SGD with foreach=True (multi-tensor update)
and environment variables (see SEARCH). --search times them all.
"""
import argparse
import gzip
import os
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--steps", type=int, default=300, help="timed steps")
    p.add_argument("--warmup", type=int, default=30, help="untimed steps first")
    p.add_argument("--epochs", type=int, default=0,
                   help="> 0: accuracy run of E full epochs instead of timing")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--openblas-threads", type=int, default=None,
                   help="set OPENBLAS_NUM_THREADS (before torch loads OpenBLAS)")
    p.add_argument("--mkldnn", choices=["on", "off"], default="on")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--foreach", action="store_true")
    p.add_argument("--search", action="store_true",
                   help="time every candidate setting (SEARCH below) --reps times, "
                        "alternating, and print the median of each and the best")
    p.add_argument("--search-all", action="store_true", help="--search, with SEARCH_MORE too")
    p.add_argument("--reps", type=int, default=3, help="repetitions per candidate in --search")
    return p.parse_args()


# Candidate settings for --search: (name, extra environment, extra arguments).
# OPENBLAS_NUM_THREADS=1 stops OpenBLAS's own pthreads fighting PyTorch's
# OpenMP threads for the 2 cores. MALLOC: glibc's malloc serves blocks over
# its mmap threshold (128 KiB, raised only when such a block is freed) with a
# fresh mmap, so every step's multi-MB activations and gradients are new pages
# to fault in and zero; a fixed 32 MiB threshold (and a trim threshold above
# it) keeps them on the heap, reused. OMP_WAIT_POLICY=PASSIVE makes idle
# OpenMP threads sleep instead of spin: slower on an idle machine, much faster
# when other processes share the cores.
OBT1 = {"OPENBLAS_NUM_THREADS": "1"}
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "268435456"}
PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}
SEARCH = [
    ("default", {}, []),
    ("obt1", OBT1, []),
    ("obt1+cl", OBT1, ["--channels-last"]),
    ("obt1+cl+malloc", {**OBT1, **MALLOC}, ["--channels-last"]),
    ("obt1+cl+malloc+passive", {**OBT1, **MALLOC, **PASSIVE}, ["--channels-last"]),
    ("obt1+cl+malloc+foreach", {**OBT1, **MALLOC}, ["--channels-last", "--foreach"]),
]
# Not better on the reference machine, so searched only with --search-all.
SEARCH_MORE = [
    ("passive", PASSIVE, []),
    ("obt1+cl+passive", {**OBT1, **PASSIVE}, ["--channels-last"]),
    ("obt1+nomkldnn", OBT1, ["--mkldnn", "off"]),
]
for lib in ("libjemalloc.so.2", "libtcmalloc_minimal.so.4"):   # when installed
    if os.path.exists(f"/usr/lib/x86_64-linux-gnu/{lib}"):
        SEARCH_MORE.append((f"obt1+cl+{lib.split('.')[0]}",
                            {**OBT1, "LD_PRELOAD": f"/usr/lib/x86_64-linux-gnu/{lib}"},
                            ["--channels-last"]))
# OpenBLAS 0.3.21 does not know this CPU model and, unless OPENBLAS_CORETYPE
# is set, falls back to its Prescott (SSE3) kernels: ~5x slower sgemm.
if "OPENBLAS_CORETYPE" not in os.environ:
    SEARCH.append(("obt1+cl+malloc+SkylakeX", {**OBT1, **MALLOC, "OPENBLAS_CORETYPE": "SkylakeX"},
                   ["--channels-last"]))


def search(args):
    cands = SEARCH + (SEARCH_MORE if args.search_all else [])
    import re
    import statistics
    import subprocess
    base = [sys.executable, os.path.abspath(__file__), "--threads", str(args.threads),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch),
            "--data", args.data]
    got = {name: [] for name, _, _ in cands}
    for r in range(args.reps):
        for name, env, extra in cands:                  # alternate: one of each per round
            out = subprocess.run(base + extra, env={**os.environ, **env}, check=True,
                                 capture_output=True, text=True).stdout
            m = re.search(r"images_per_s=([0-9.]+)", out)
            got[name].append(float(m.group(1)))
            print(f"# rep {r + 1} {name}: {m.group(1)} images/s", file=sys.stderr, flush=True)
    best = None
    for name, env, extra in cands:
        med = statistics.median(got[name])
        envs = " ".join(f"{k}={v}" for k, v in env.items()) or "-"
        print(f"pytorch_search threads={args.threads} setting={name} images_per_s={med:.1f} "
              f"runs={','.join(f'{x:.0f}' for x in got[name])} env={envs} "
              f"args={' '.join(extra) or '-'}", flush=True)
        if best is None or med > best[1]:
            best = (name, med, envs, extra)
    print(f"pytorch_best threads={args.threads} setting={best[0]} images_per_s={best[1]:.1f} "
          f"env={best[2]} args={' '.join(best[3]) or '-'}", flush=True)


args = parse_args()
if args.search or args.search_all:
    search(args)
    sys.exit(0)
if args.openblas_threads is not None:
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.openblas_threads)

import numpy as np  # noqa: E402  (after the environment is set)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic = int.from_bytes(raw[0:4], "big")
    ndim = magic & 0xFF
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(args.data, f"{prefix}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(args.data, f"{prefix}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(x.astype(np.float32) / 255.0)
    x = ((x - MEAN) / STD).unsqueeze(1).contiguous()          # N x 1 x 28 x 28
    y = torch.from_numpy(y.astype(np.int64))
    return x, y


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


def main():
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.backends.mkldnn.enabled = args.mkldnn == "on"
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format

    xtr, ytr = load("train")
    if args.channels_last:
        xtr = xtr.contiguous(memory_format=fmt)
    model = Net().to(memory_format=fmt)
    sgd_kw = {"foreach": True} if args.foreach else {}
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, **sgd_kw)
    n, b = xtr.shape[0], args.batch
    gen = torch.Generator().manual_seed(args.seed)

    def batches():
        while True:
            perm = torch.randperm(n, generator=gen)
            for i in range(0, n - b + 1, b):          # drop the last partial batch
                idx = perm[i:i + b]
                yield xtr.index_select(0, idx), ytr.index_select(0, idx)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    setting = (f"mkldnn={args.mkldnn} channels_last={int(args.channels_last)} "
               f"foreach={int(args.foreach)} "
               + " ".join(f"{k}={os.environ.get(k, 'unset')}" for k in
                          ("OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OMP_WAIT_POLICY",
                           "MALLOC_MMAP_THRESHOLD_", "LD_PRELOAD")))

    if args.epochs > 0:
        xte, yte = load("test")
        if args.channels_last:
            xte = xte.contiguous(memory_format=fmt)
        it = batches()
        per_epoch = n // b
        for epoch in range(1, args.epochs + 1):
            model.train()
            t0 = time.perf_counter()
            total = 0.0
            for _ in range(per_epoch):
                x, y = next(it)
                total += step(x, y).item()
            dt = time.perf_counter() - t0
            model.eval()
            correct = 0
            with torch.no_grad():
                for i in range(0, xte.shape[0], 1000):
                    correct += (model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum().item()
            acc = correct / xte.shape[0]
            print(f"pytorch epoch={epoch} train_loss={total / per_epoch:.4f} "
                  f"test_accuracy={acc:.4f} images_per_s={per_epoch * b / dt:.1f} "
                  f"threads={args.threads} {setting}", flush=True)
        return

    it = batches()
    model.train()
    for _ in range(args.warmup):
        step(*next(it))
    # Batches are sliced inside the timed loop: feeding is part of training.
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(args.steps):
        loss = step(*next(it))
    loss.item()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    # cpu_s: CPU seconds of all this process's threads; on a shared machine
    # cpu_s/seconds well under `threads` means it was kept waiting.
    print(f"pytorch images_per_s={args.steps * b / dt:.1f} threads={args.threads} "
          f"steps={args.steps} warmup={args.warmup} batch={b} seconds={dt:.3f} cpu_s={cpu:.3f} "
          f"loss={loss.item():.4f} torch={torch.__version__} {setting}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
