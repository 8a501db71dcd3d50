#!/usr/bin/python3
"""PyTorch reference for cnnflow's training benchmarks (issues 2, 6 and 11).

Trains, in eager mode, the same models as cnnflow's configs:
  --model mlp2      model A, the "two-layer CNN + FC" of configs/fashion_mnist.yaml
                    (conv 1->32 3x3 pad 1, ReLU, maxpool 2; conv 32->64, ReLU,
                    maxpool 2; linear 3136->128, ReLU; linear 128->10), batch 64,
                    SGD lr 0.01 momentum 0.9
  --model cnn3      model B, the "three-layer CNN + FC" of
                    configs/fashion_mnist_cnn3.yaml (conv 1->32, 32->64,
                    64->128, each 3x3 pad 1 + ReLU + maxpool 2; linear
                    1152->128, ReLU; linear 128->10), batch 64, SGD lr 0.01
                    momentum 0.9
  --model resnet18  the CIFAR ResNet-18 of configs/resnet18_cifar.yaml (3x3
                    stem conv 64 + BN + ReLU, 4 stages x 2 BasicBlocks, 1x1
                    conv + BN shortcuts at stride 2, global average pool,
                    linear 512->10), batch 256 (the issue-11 CPU bench: --batch
                    64), SGD lr 0.1 momentum 0.9 weight decay 5e-4
  --model m5        the M5-style 1D CNN of configs/spoken_digits.yaml on raw
                    audio [1, 8000]: conv1d 1->32 k80 s4 (no bias), BN, ReLU,
                    maxpool1d 4; conv1d 32->32 k3 p1, BN, ReLU, pool 4; conv1d
                    32->64 k3 p1, BN, ReLU, pool 4; conv1d 64->64 k3 p1, BN,
                    ReLU, pool 4 (convs without bias); global average pool;
                    linear 64->10; batch 32, Adam lr 0.01 weight decay 1e-4 (L2,
                    as torch.optim.Adam and cnnflow's `adam`). The config's
                    cosine schedule is left out (one scalar per step).
  --model resnet50 | mobilenet_v2 | efficientnet_b0
                    torchvision.models.<name>(num_classes=1000) with
                    torchvision's defaults (train mode: mobilenet_v2's and
                    efficientnet_b0's classifier dropout 0.2, efficientnet_b0's
                    stochastic depth 0.2), the model library's networks of
                    bench/configs/<name>_synthetic.yaml (issue 29), on
                    synthetic 3x224x224 data with 1000 classes; batch 16, SGD
                    lr 0.01 momentum 0.9, weight decay 1e-4 (resnet50), 4e-5
                    (mobilenet_v2), 1e-5 (efficientnet_b0).
                    Needs torchvision (the venv's; Debian's torch 1.13 has none).
and softmax cross-entropy. Parameter counts (printed as params=) are those
`cnnflow validate` prints: 421,642 / 241,546 / 11,173,962 / 25,098, and
25,557,032 / 3,504,872 / 5,288,548 for the torchvision models.

Data (--source):
  idx        the real Fashion-MNIST (mlp2 and cnn3 only; their default): the
             whole set normalised once into one float tensor, shuffled
             batches sliced from it with index_select inside the timed loop
             (no DataLoader, no worker processes), the fastest way PyTorch
             allows on a CPU
  synthetic  (the default for resnet18 and m5, and what bench/gpu_vs_pytorch.sh
             uses) --pool-batches batches made once, like cnnflow's
             `synthetic` source: unit-variance uniform noise plus a per-class
             channel mean, labels uniform over 10 classes (1000 for the
             torchvision models, whose pool is 2 batches by default: 9.6 MB
             each at 224x224, batch 16, counted in the peak RSS)
--feed host (default): batches live in host memory (pinned on a GPU) and each
step copies its batch to the device with non_blocking=True, as cnnflow does;
--feed device: the batches are made on the device once (no copy in the loop).

Run it with Debian's interpreter on the build machine (it has torch 1.13, CPU):
    /usr/bin/python3 bench/pytorch_train.py --threads 2 --steps 300
    /usr/bin/python3 bench/pytorch_train.py --threads 2 --epochs 10   # accuracy
    /usr/bin/python3 bench/pytorch_train.py --model resnet18 --device cpu --batch 64 --steps 3
    .venv-torch/bin/python bench/pytorch_train.py --model m5 --steps 50   # PyTorch 2.x
    .venv-torch/bin/python bench/pytorch_train.py --model resnet50 --channels-last --steps 10 --warmup 2
and on the GPU machine with its python3 (torch 2.x, CUDA):
    python3 bench/pytorch_train.py --model resnet18 --device cuda --precision bf16
    python3 bench/pytorch_train.py --model resnet50 --device cuda --precision bf16 \
        --channels-last --compile max-autotune    # PyTorch at its best

Throughput mode (default): --warmup W untimed steps, then --steps S timed
steps (on a GPU: synchronised before and after); prints one line
    pytorch model=... precision=... device=... batch=... images_per_s=... threads=... ...
with max_rss_mb= the process's peak resident set (getrusage ru_maxrss).
Accuracy mode (--epochs E > 0, --source idx): E full epochs, test accuracy
after each.

Precision: fp32 (PyTorch's defaults: cuDNN convolutions may use TF32, matmuls
do not; printed as tf32_conv / tf32_matmul), bf16 (autocast), fp16 (autocast
+ GradScaler; GPU only). On a GPU torch.backends.cudnn.benchmark = True.

CPU settings (the "best setting" search of bench/README.md):
    --openblas-threads N   sets OPENBLAS_NUM_THREADS before torch is imported
    --mkldnn on|off        torch.backends.mkldnn.enabled (oneDNN convolutions)
    --channels-last        model and input in torch.channels_last (4D tensors
                           only: a no-op for m5, printed as channels_last=n/a)
    --foreach              SGD with foreach=True (multi-tensor update)
    --flush-denormal       torch.set_flush_denormal(True) before any work, so
                           the intra-op threads inherit it (cnnflow's
                           graph.flush_denormals, on by default)
and environment variables (see SEARCH). --search times them all.
Works with torch 1.13 (Debian) and 2.x (the PyPI wheel, bench/torch_venv.sh).
"""
import argparse
import gzip
import os
import resource
import sys
import time


# Sample shape of each model (the synthetic source makes these).
SHAPES = {"mlp2": (1, 28, 28), "cnn3": (1, 28, 28), "resnet18": (3, 32, 32), "m5": (1, 8000),
          "resnet50": (3, 224, 224), "mobilenet_v2": (3, 224, 224), "efficientnet_b0": (3, 224, 224)}
IDX_MODELS = ("mlp2", "cnn3")   # the Fashion-MNIST models
# torchvision.models.<name>(num_classes=1000): the model library's networks (issue 29).
TORCHVISION_MODELS = ("resnet50", "mobilenet_v2", "efficientnet_b0")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(SHAPES), default="mlp2",
                   help="mlp2: configs/fashion_mnist.yaml's model (A); cnn3: "
                        "configs/fashion_mnist_cnn3.yaml's (B); resnet18: "
                        "configs/resnet18_cifar.yaml's; m5: configs/spoken_digits.yaml's; "
                        "resnet50, mobilenet_v2, efficientnet_b0: torchvision's (1000 "
                        "classes, 3x224x224), as bench/configs/<name>_synthetic.yaml")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                   help="bf16/fp16: torch.autocast (fp16 with a GradScaler, GPU only)")
    p.add_argument("--source", choices=["idx", "synthetic"], default=None,
                   help="data: the real Fashion-MNIST (mlp2 and cnn3 only; their default) or "
                        "synthetic batches (the default of resnet18 and m5)")
    p.add_argument("--feed", choices=["host", "device"], default="host",
                   help="host: batches in (pinned) host memory, copied to the device each step "
                        "with non_blocking=True, as cnnflow does; device: made on the device once")
    p.add_argument("--pool-batches", type=int, default=None,
                   help="synthetic: distinct batches made up front and cycled through "
                        "(default 16; 2 for the torchvision models, 9.6 MB each)")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--steps", type=int, default=300, help="timed steps")
    p.add_argument("--rounds", type=int, default=1,
                   help="timed segments of --steps each (one compile for all): each printed "
                        "as round_images_per_s=, the main line's images_per_s their median")
    p.add_argument("--tf32", action="store_true",
                   help="TF32 for f32 matmuls too (torch.backends.cuda.matmul.allow_tf32; "
                        "cuDNN's convolutions allow it by default): PyTorch's best fp32")
    p.add_argument("--warmup", type=int, default=30, help="untimed steps first")
    p.add_argument("--epochs", type=int, default=0,
                   help="> 0: accuracy run of E full epochs instead of timing")
    p.add_argument("--batch", type=int, default=None,
                   help="default: the config's (mlp2 64, cnn3 64, resnet18 256, m5 32; "
                        "the torchvision models 16)")
    p.add_argument("--optimizer", choices=["sgd", "adam"], default=None,
                   help="default: the config's (m5 adam, the others sgd)")
    p.add_argument("--lr", type=float, default=None,
                   help="default: the config's (mlp2 0.01, cnn3 0.01, resnet18 0.1, m5 0.01, "
                        "the torchvision models 0.01)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD only")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="default: the config's (mlp2 0, cnn3 0, resnet18 5e-4, m5 1e-4, "
                        "resnet50 1e-4, mobilenet_v2 4e-5, efficientnet_b0 1e-5)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--openblas-threads", type=int, default=None,
                   help="set OPENBLAS_NUM_THREADS (before torch loads OpenBLAS)")
    p.add_argument("--mkldnn", choices=["on", "off"], default="on")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", choices=["none", "default", "max-autotune"], default="none",
                   help="torch.compile the model in this mode (torch 2.x); the first warm-up "
                        "step, which compiles, is timed apart as compile_s")
    p.add_argument("--foreach", action="store_true")
    p.add_argument("--flush-denormal", action="store_true",
                   help="torch.set_flush_denormal(True): denormals as zero")
    p.add_argument("--search", action="store_true",
                   help="time every candidate setting (SEARCH below) --reps times, "
                        "alternating, and print the median of each and the best")
    p.add_argument("--search-all", action="store_true", help="--search, with SEARCH_MORE too")
    p.add_argument("--reps", type=int, default=3, help="repetitions per candidate in --search")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="after the timed steps, profile --profile-steps more with "
                        "torch.profiler and write its Chrome trace to FILE "
                        "(bench/gpu_profile_table.py reads it)")
    p.add_argument("--profile-steps", type=int, default=20)
    a = p.parse_args()
    # The configs' settings (configs/fashion_mnist.yaml, fashion_mnist_cnn3.yaml,
    # resnet18_cifar.yaml, spoken_digits.yaml): batch, optimizer, lr, weight decay.
    defaults = {"mlp2": (64, "sgd", 0.01, 0.0), "cnn3": (64, "sgd", 0.01, 0.0),
                "resnet18": (256, "sgd", 0.1, 5e-4), "m5": (32, "adam", 0.01, 1e-4),
                "resnet50": (16, "sgd", 0.01, 1e-4), "mobilenet_v2": (16, "sgd", 0.01, 4e-5),
                "efficientnet_b0": (16, "sgd", 0.01, 1e-5)}[a.model]
    if a.batch is None:
        a.batch = defaults[0]
    if a.optimizer is None:
        a.optimizer = defaults[1]
    if a.lr is None:
        a.lr = defaults[2]
    if a.weight_decay is None:
        a.weight_decay = defaults[3]
    if a.source is None:
        a.source = "idx" if a.model in IDX_MODELS else "synthetic"
    if a.pool_batches is None:
        a.pool_batches = 2 if a.model in TORCHVISION_MODELS else 16
    if a.source == "idx" and a.model not in IDX_MODELS:
        p.error("--source idx (Fashion-MNIST, 1x28x28) fits --model mlp2 or cnn3 only")
    if a.precision == "fp16" and a.device != "cuda":
        p.error("--precision fp16 needs --device cuda (CPU autocast is bf16 only)")
    if a.epochs > 0 and a.source != "idx":
        p.error("--epochs (accuracy) needs --source idx")
    return a


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


def openblas_coretype():
    """The OpenBLAS core type this CPU's features allow: SkylakeX (AVX-512
    kernels) with avx512f, Haswell (AVX2 + FMA) with avx2, else None (let
    OpenBLAS detect). Never AVX-512 kernels on an AVX2-only CPU."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return None
    if "avx512f" in flags:
        return "SkylakeX"
    if "avx2" in flags:
        return "Haswell"
    return None


# OpenBLAS 0.3.21 does not know some CPU models (the Xeon of issue 2) and,
# unless OPENBLAS_CORETYPE is set, falls back to its Prescott (SSE3) kernels:
# ~5x slower sgemm. Torch 1.13 (Debian) runs its GEMMs on OpenBLAS; the PyPI
# wheel of 2.x uses MKL, so there this setting changes nothing.
if "OPENBLAS_CORETYPE" not in os.environ and openblas_coretype():
    SEARCH.append((f"obt1+cl+malloc+{openblas_coretype()}",
                   {**OBT1, **MALLOC, "OPENBLAS_CORETYPE": openblas_coretype()},
                   ["--channels-last"]))


def search(args):
    cands = SEARCH + (SEARCH_MORE if args.search_all else [])
    import re
    import statistics
    import subprocess
    base = [sys.executable, os.path.abspath(__file__), "--threads", str(args.threads),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch),
            "--data", args.data, "--model", args.model, "--source", args.source,
            "--device", args.device, "--precision", args.precision,
            "--optimizer", args.optimizer, "--lr", str(args.lr),
            "--weight-decay", str(args.weight_decay), "--pool-batches", str(args.pool_batches)]
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


import torch  # noqa: E402  (after the environment is set)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    import numpy as np  # only the IDX path needs it (a GPU machine may lack it)
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic = int.from_bytes(raw[0:4], "big")
    ndim = magic & 0xFF
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(split):
    import numpy as np
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(args.data, f"{prefix}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(args.data, f"{prefix}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(x.astype(np.float32) / 255.0)
    x = ((x - MEAN) / STD).unsqueeze(1).contiguous()          # N x 1 x 28 x 28
    y = torch.from_numpy(y.astype(np.int64))
    return x, y


def synthetic(shape, classes, n, gen, separation=1.0):
    """n samples as cnnflow's `synthetic` source makes them (same distribution,
    not the same values): uniform noise in [-sqrt 3, sqrt 3) plus, for class k
    and channel c, separation * (2 ((k + c) mod K) + 1 - K) / K."""
    y = torch.randint(0, classes, (n,), generator=gen)
    x = (torch.rand((n,) + tuple(shape), generator=gen) * 2 - 1) * 3 ** 0.5
    k = torch.arange(classes).unsqueeze(1)
    c = torch.arange(shape[0]).unsqueeze(0)
    means = separation * (2 * ((k + c) % classes) + 1 - classes).float() / classes  # K x C
    x += means[y].reshape((n, shape[0]) + (1,) * (len(shape) - 1))
    return x, y


class Net(nn.Module):
    """The "two-layer CNN + FC" of configs/fashion_mnist.yaml (--model mlp2)."""

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


class Net3(nn.Module):
    """The "three-layer CNN + FC" of configs/fashion_mnist_cnn3.yaml (--model cnn3)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 128, 3, padding=1)
        self.fc1 = nn.Linear(128 * 3 * 3, 128)        # 28 -> 14 -> 7 -> 3 (floor)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


class M5(nn.Module):
    """The M5-style 1D CNN of configs/spoken_digits.yaml (--model m5), input
    [N, 1, 8000] -> conv1 [32, 1981] -> pool [32, 495] -> [32, 123] -> [64, 30]
    -> [64, 7] -> global average pool [64] -> linear 10."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv1d(1, 32, 80, stride=4, bias=False)
        self.bn1 = nn.BatchNorm1d(32)
        self.conv2 = nn.Conv1d(32, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm1d(32)
        self.conv3 = nn.Conv1d(32, 64, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm1d(64)
        self.conv4 = nn.Conv1d(64, 64, 3, padding=1, bias=False)
        self.bn4 = nn.BatchNorm1d(64)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        for conv, bn in ((self.conv1, self.bn1), (self.conv2, self.bn2),
                         (self.conv3, self.bn3), (self.conv4, self.bn4)):
            x = F.max_pool1d(F.relu(bn(conv(x)), inplace=True), 4)
        return self.fc(x.mean(dim=2))


MODELS = {"mlp2": Net, "cnn3": Net3, "m5": M5}


def make_model(name):
    if name in TORCHVISION_MODELS:
        import torchvision  # only these models need it
        return getattr(torchvision.models, name)(num_classes=CLASSES[name])
    return MODELS.get(name, ResNet18)()


CLASSES = {m: 1000 for m in TORCHVISION_MODELS}   # the others: 10


class BasicBlock(nn.Module):
    """conv3x3 (stride s) -> BN -> ReLU -> conv3x3 -> BN, + the input or its
    1x1 conv (stride s) + BN projection, -> ReLU (torchvision's BasicBlock)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        out = out + (x if self.down is None else self.down(x))
        return F.relu(out, inplace=True)


class ResNet18(nn.Module):
    """The CIFAR ResNet-18 of configs/resnet18_cifar.yaml (--model resnet18)."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        blocks, cin = [], 64
        for stage, cout in enumerate([64, 128, 256, 512]):
            for b in range(2):
                blocks.append(BasicBlock(cin, cout, 2 if stage > 0 and b == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)), inplace=True)
        x = self.blocks(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


def main():
    if args.flush_denormal and not torch.set_flush_denormal(True):
        sys.exit("torch.set_flush_denormal: not supported on this CPU")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.backends.mkldnn.enabled = args.mkldnn == "on"
    cuda = args.device == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            sys.exit("pytorch_train.py: --device cuda but torch.cuda.is_available() is False")
        torch.backends.cudnn.benchmark = True
        if args.tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
    dev = torch.device(args.device)
    # channels_last exists for 4D tensors only: the 1D model stays contiguous.
    four_d = len(SHAPES[args.model]) == 3
    fmt = torch.channels_last if args.channels_last and four_d else torch.contiguous_format
    model = make_model(args.model).to(dev, memory_format=fmt)
    params = sum(p.numel() for p in model.parameters())
    if args.compile != "none":
        if not hasattr(torch, "compile"):
            sys.exit(f"pytorch_train.py: --compile needs torch 2.x, this is {torch.__version__}")
        model = torch.compile(model, mode=None if args.compile == "default" else args.compile)
    opt_kw = {"foreach": True} if args.foreach else {}
    if args.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                               **opt_kw)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                              weight_decay=args.weight_decay, **opt_kw)
    b = args.batch
    gen = torch.Generator().manual_seed(args.seed)
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = None
    if args.precision == "fp16":
        amp = getattr(torch, "amp", None)
        scaler = (amp.GradScaler("cuda") if amp is not None and hasattr(amp, "GradScaler")
                  else torch.cuda.amp.GradScaler())

    def to_dev(x, y):  # pinned host -> device, asynchronous; a no-op on the CPU
        return (x.to(dev, non_blocking=True, memory_format=fmt) if cuda else x,
                y.to(dev, non_blocking=True) if cuda else y)

    if args.source == "idx":
        xtr, ytr = load("train")
        if args.channels_last:
            xtr = xtr.contiguous(memory_format=fmt)
        n = xtr.shape[0]

        def batches():  # host batches (the CPU benchmark's feeding)
            while True:
                perm = torch.randperm(n, generator=gen)
                for i in range(0, n - b + 1, b):          # drop the last partial batch
                    idx = perm[i:i + b]
                    yield to_dev(xtr.index_select(0, idx), ytr.index_select(0, idx))
    else:
        shape = SHAPES[args.model]
        pool = []
        for _ in range(args.pool_batches):
            x, y = synthetic(shape, CLASSES.get(args.model, 10), b, gen)
            x = x.contiguous(memory_format=fmt)
            if cuda and args.feed == "device":
                x, y = to_dev(x, y)
            elif cuda:
                x, y = x.pin_memory(), y.pin_memory()
            pool.append((x, y))

        def batches():
            while True:
                for x, y in pool:
                    yield to_dev(x, y) if args.feed == "host" else (x, y)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        if half is not None:
            with torch.autocast(device_type=args.device, dtype=half):
                loss = F.cross_entropy(model(x), y)
        else:
            loss = F.cross_entropy(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    cl = int(args.channels_last) if four_d else "n/a"
    setting = (f"mkldnn={args.mkldnn} channels_last={cl} compile={args.compile} "
               f"foreach={int(args.foreach)} flush_denormal={int(args.flush_denormal)} "
               + " ".join(f"{k}={os.environ.get(k, 'unset')}" for k in
                          ("OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OMP_WAIT_POLICY",
                           "MALLOC_MMAP_THRESHOLD_", "LD_PRELOAD")))
    if cuda:
        setting += (f" gpu={torch.cuda.get_device_name(0).replace(' ', '_')}"
                    f" cudnn={torch.backends.cudnn.version()}"
                    f" tf32_conv={int(torch.backends.cudnn.allow_tf32)}"
                    f" tf32_matmul={int(torch.backends.cuda.matmul.allow_tf32)}")

    if args.epochs > 0:
        xte, yte = load("test")
        if args.channels_last:
            xte = xte.contiguous(memory_format=fmt)
        xte, yte = xte.to(dev), yte.to(dev)
        it = batches()
        per_epoch = n // b
        for epoch in range(1, args.epochs + 1):
            model.train()
            t0 = time.perf_counter()
            total = 0.0
            for _ in range(per_epoch):
                total += step(*next(it)).item()
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
    first = None
    compile_s = 0.0  # the first step's time with --compile: tracing, compiling, autotuning
    for i in range(args.warmup):
        t_first = time.perf_counter()
        loss = step(*next(it))
        if i == 0:
            first = loss.item()
            if args.compile != "none":
                compile_s = time.perf_counter() - t_first
    if cuda:
        torch.cuda.synchronize()
    # Batches are sliced (idx) or copied to the device (--feed host) inside
    # the timed loop: feeding is part of training.
    seconds = []
    c0 = time.process_time()
    for r in range(args.rounds):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step(*next(it))
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
        if args.rounds > 1:
            print(f"pytorch round={r} round_images_per_s={args.steps * b / seconds[-1]:.1f}",
                  flush=True)
    dt = sorted(seconds)[len(seconds) // 2]  # the median round (the middle one of an odd count)
    cpu = (time.process_time() - c0) / args.rounds
    # cpu_s: CPU seconds of all this process's threads; on a shared machine
    # cpu_s/seconds well under `threads` means it was kept waiting.
    # max_rss_mb: the process's peak resident set so far (Linux: KiB).
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    feed = f"feed={args.feed if cuda else 'host'}" if args.source == "synthetic" else "feed=index_select"
    print(f"pytorch model={args.model} precision={args.precision} device={args.device} batch={b} "
          f"images_per_s={args.steps * b / dt:.1f} threads={args.threads} steps={args.steps} "
          f"warmup={args.warmup} seconds={dt:.3f} cpu_s={cpu:.3f} max_rss_mb={rss_mb:.1f} "
          f"compile_s={compile_s:.1f} "
          f"first_loss={first if first is not None else float('nan'):.4f} loss={loss.item():.4f} "
          f"source={args.source} {feed} optimizer={args.optimizer} params={params} "
          f"torch={torch.__version__} {setting}", flush=True)
    if args.profile:
        profile(args, lambda: step(*next(it)), cuda)


def profile(args, run_step, cuda):
    """--profile: the kernels of --profile-steps steps, one ProfilerStep# each."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        for _ in range(args.profile_steps):
            run_step()
            prof.step()
        if cuda:
            torch.cuda.synchronize()
    prof.export_chrome_trace(args.profile)
    print(f"pytorch profile of {args.profile_steps} steps: {args.profile}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
