"""airbench_pytorch.py: the airbench94 CIFAR-10 speed-run recipe (Jordan,
2024) as a plain PyTorch 2.x script, on the CPU or on a GPU: the PyTorch
side of the time-to-accuracy benchmark (issues 32 and 59;
bench/time_to_accuracy.sh runs it side by side with cnnflow's
configs/cifar10_speedrun.yaml).

Written for this project from the recipe's description (no code taken over);
every hyperparameter below is airbench94's, converted where its conventions
differ from PyTorch's (see RECIPE and the notes beside it).

usage: PY bench/airbench_pytorch.py [--data DIR] [--device cpu|cuda]
           [--threads 2] [--precision fp32|bf16|fp16] [--compile]
           [--seed 0] [--epochs 9.9] [--subset N] [--batch 1024] [--json]
  --data DIR     the CIFAR-10 JPEG folder DIR/{train,test}/<class>/<n>.jpg
                 (default $CNNFLOW_DATA_DIR/cifar10-jpeg, else
                 data/cifar10-jpeg in the repository root)
  --device D     cpu (default) or cuda (the first GPU): the decoded images
                 are uploaded once, as uint8 (the training set
                 reflect-padded, channels-last), and every batch is cut,
                 flipped and normalised on the GPU; cuDNN's benchmark mode on
  --precision P  fp32 (default), bf16 (autocast), fp16 (autocast, cuda
                 only: airbench94's own); weights, BatchNorm and the loss
                 stay fp32
  --compile      torch.compile the network (dynamic=False); the compile and
                 a warm-up of every variant the run calls (training with and
                 without the whitening bias, evaluation) run before the
                 timed span and are reported as compile_s. On cuda the
                 warm-up runs without --compile too (cuDNN's algorithm
                 search), on the CPU only with it
  --subset N     train on the first N training images only (a smoke test);
                 the images are ordered by (n, class), so any prefix holds
                 every class equally; the test set stays whole
  --json         print one JSON line on stdout: seed, device, gpu,
                 precision, compile, threads, epochs, accuracy, accuracy_tta
                 (test accuracy in %, without and with test-time
                 augmentation), timed_s, decode_s, compile_s, train_s,
                 eval_s, data_s, wall_s, torch, isa (and a few more keys)
Progress goes to stderr. The figures, in seconds:
  timed_s    airbench's timed span: from the start of the whitening init
             (the data already in memory, on the device) to the end of the
             TTA evaluation, the GPU synchronised at both ends
             (torch.cuda.synchronize); train_s + eval_s
  train_s    the whitening init and the training epochs
  eval_s     the final evaluation (both accuracies from one pass)
  decode_s   before the span: reading and decoding the JPEGs, padding, and
             on cuda the upload; data_s is its decode part alone (the
             figure the rows before the GPU runs called data_s)
  compile_s  before the span: torch.compile and the warm-up (0 when none ran)
  wall_s     from the first statement of this script (before torch is
             imported) to the end of the TTA evaluation: everything above
"""
import time

T0 = time.perf_counter()  # wall time starts here, before torch is imported

import argparse
import json
import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# airbench94's hyperparameters, in its own (decoupled) units. lr and
# weight_decay are "per 1024 examples" with the loss summed over the batch;
# make_optimizer turns them into torch.optim.SGD's units the way airbench94
# does.
RECIPE = {
    "batch": 1024,
    "epochs": 9.9,
    "lr": 11.5,               # per 1024 examples
    "momentum": 0.85,         # Nesterov
    "weight_decay": 0.0153,   # per 1024 examples, decoupled from the lr
    "bias_lr_scale": 64.0,    # BN biases: 64x the lr, the same decay per step
    "label_smoothing": 0.2,
    # triangular schedule: lr factor 0.2 at step 0, 1.0 at 23% of the steps,
    # 0.07 at the last step, linear in between
    "schedule": (0.2, 0.23, 1.0, 0.07),
    # lookahead: from epoch 3, every 5 steps the weights move to an EMA of
    # themselves whose decay is 0.95**5 * (step / total_steps)**3
    "ema_start_epoch": 3, "ema_every": 5, "ema_decay_base": 0.95, "ema_decay_pow": 3.0,
    "whiten_bias_epochs": 3,  # the whitening conv's bias trains this long, then freezes
    "whiten_eps": 5e-4,
    "whiten_images": 5000,    # training images whose 2x2 patches give the covariance
    # BatchNorm: momentum in PyTorch's convention, the weight of the new
    # batch statistic: running = 0.6 * running + 0.4 * batch. (airbench94
    # writes 0.6 in its own convention, the weight of the old statistic, and
    # passes 1 - 0.6 to nn.BatchNorm2d.) eps 1e-12; the scale is frozen at 1.
    "bn_momentum": 0.4, "bn_eps": 1e-12,
    "widths": (64, 256, 256),
    "logit_scale": 1.0 / 9.0,
    "translate": 2,           # random translation, reflect padding
}
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_isa():
    """The SIMD flags of ISA_FLAGS that /proc/cpuinfo lists, joined by '+'."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    found = [x for x in ISA_FLAGS if x in have]
                    return "+".join(found) if found else "none"
    except OSError:
        pass
    return "unknown"


def log(msg):
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# --- data ----------------------------------------------------------------------

def list_split(folder):
    """[(path, label)] of folder/<class>/<n>.jpg, classes in sorted order,
    ordered by (n, class) so that every prefix is class-balanced."""
    classes = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    if not classes:
        raise SystemExit(f"airbench_pytorch.py: no class folders in {folder}")
    items = []
    for label, c in enumerate(classes):
        for name in os.listdir(os.path.join(folder, c)):
            stem, ext = os.path.splitext(name)
            if ext.lower() in (".jpg", ".jpeg", ".png"):
                key = int(stem) if stem.isdigit() else stem
                items.append(((0, key) if isinstance(key, int) else (1, key), label,
                              os.path.join(folder, c, name)))
    items.sort(key=lambda t: (t[0], t[1]))
    return [(p, label) for _, label, p in items], classes


def decode_split(folder, threads, limit=None):
    """Decodes every image of a split once: uint8 [N, 3, 32, 32], int64 [N]."""
    from PIL import Image
    items, classes = list_split(folder)
    if limit is not None:
        items = items[:limit]

    def load(path):
        with Image.open(path) as im:
            a = np.asarray(im.convert("RGB"), dtype=np.uint8)
        if a.shape != (32, 32, 3):
            raise SystemExit(f"airbench_pytorch.py: {path} is {a.shape}, not 32x32x3")
        return a

    # Pillow releases the GIL while it decodes: a thread per core.
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        arrays = list(pool.map(load, [p for p, _ in items], chunksize=256))
    images = np.stack(arrays).transpose(0, 3, 1, 2).copy()  # NHWC -> NCHW
    labels = np.array([label for _, label in items], dtype=np.int64)
    return images, labels, classes


# --- the network ---------------------------------------------------------------

def build_net(torch, nn):
    r = RECIPE

    class Conv3(nn.Conv2d):
        """3x3 'same' conv without bias; its first in-channels filters are
        the identity (dirac), the rest keep PyTorch's default init."""
        def __init__(self, cin, cout):
            super().__init__(cin, cout, 3, padding="same", bias=False)
            with torch.no_grad():
                nn.init.dirac_(self.weight[:cin])

    class Norm(nn.BatchNorm2d):
        def __init__(self, c):
            super().__init__(c, eps=r["bn_eps"], momentum=r["bn_momentum"])
            self.weight.requires_grad_(False)  # scale frozen at 1; bias trained

    class Group(nn.Module):
        """conv, max-pool 2, BN, GELU, conv, BN, GELU."""
        def __init__(self, cin, cout):
            super().__init__()
            self.conv1, self.norm1 = Conv3(cin, cout), Norm(cout)
            self.conv2, self.norm2 = Conv3(cout, cout), Norm(cout)

        def forward(self, x):
            x = nn.functional.max_pool2d(self.conv1(x), 2)
            x = nn.functional.gelu(self.norm1(x))
            return nn.functional.gelu(self.norm2(self.conv2(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            # 2x2 whitening conv, no padding: 12 eigenvector filters and their
            # negatives (24 channels); weight frozen, bias trained at first.
            self.whiten = nn.Conv2d(3, 24, 2, padding=0, bias=True)
            self.whiten.weight.requires_grad_(False)
            with torch.no_grad():
                self.whiten.bias.zero_()
            w = r["widths"]
            self.group1, self.group2, self.group3 = Group(24, w[0]), Group(w[0], w[1]), Group(w[1], w[2])
            self.head = nn.Linear(w[2], 10, bias=False)

        def forward(self, x):
            x = nn.functional.gelu(self.whiten(x))        # 32 -> 31
            x = self.group3(self.group2(self.group1(x)))  # 31 -> 15 -> 7 -> 3
            x = nn.functional.max_pool2d(x, 3).flatten(1)
            return self.head(x) * r["logit_scale"]

    return Net()


def init_whitening(torch, conv, images):
    """Sets conv's [24, 3, 2, 2] weight from the eigen-decomposition of the
    (uncentered) covariance of every 2x2 patch (stride 1) of `images`
    (normalised float [N, 3, 32, 32], any strides, on the run's device): the
    12 eigenvectors, largest eigenvalue first, each divided by
    sqrt(eigenvalue + eps), then the same 12 negated. The covariance is
    summed where the images are (fp32), the 12x12 eigen-decomposition runs
    on the CPU in double (no cuSOLVER start-up inside the timed span)."""
    patches = images.unfold(2, 2, 1).unfold(3, 2, 1)            # [N, 3, 31, 31, 2, 2]
    patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, 12)  # rows (c, dy, dx)
    cov = (patches.T @ patches).double().cpu() / patches.shape[0]
    eigval, eigvec = torch.linalg.eigh(cov)                     # ascending
    eigval, eigvec = eigval.flip(0), eigvec.T.flip(0)           # rows = vectors, descending
    filters = (eigvec / torch.sqrt(eigval + RECIPE["whiten_eps"])[:, None]).reshape(12, 3, 2, 2)
    with torch.no_grad():
        conv.weight.copy_(torch.cat([filters, -filters]).float())


def make_optimizer(torch, net):
    """Nesterov SGD in PyTorch's units. airbench94 divides its decoupled lr by
    1024 * (1 + 1 / (1 - momentum)) (the step size of Nesterov momentum under
    constant gradients, per 1024 examples), multiplies it by 64 for the BN
    biases, and gives every group the same weight decay per step, wd: torch's
    weight_decay (multiplied by the group's lr inside the step) is wd / lr of
    that group. Both lrs follow the schedule, so the decay does too."""
    r = RECIPE
    scale = 1024 * (1 + 1 / (1 - r["momentum"]))
    lr = r["lr"] / scale
    wd = r["weight_decay"] * r["batch"] / scale
    lr_bias = lr * r["bias_lr_scale"]
    norm_biases = [p for n, p in net.named_parameters() if ".norm" in n and p.requires_grad]
    others = [p for n, p in net.named_parameters() if ".norm" not in n and p.requires_grad]
    groups = [dict(params=norm_biases, lr=lr_bias, weight_decay=wd / lr_bias, base_lr=lr_bias),
              dict(params=others, lr=lr, weight_decay=wd / lr, base_lr=lr)]
    return torch.optim.SGD(groups, lr=lr, momentum=r["momentum"], nesterov=True), (lr, lr_bias, wd)


def lr_factor(step, total):
    start, peak_at, peak, end = RECIPE["schedule"]
    return float(np.interp(step, [0, int(peak_at * total), total], [start, peak, end]))


class Lookahead:
    """An EMA of every float tensor of the state dict (weights and BN running
    statistics), copied back into the network at each update (one foreach
    kernel per list on a GPU, where torch has them)."""
    def __init__(self, torch, net):
        self.torch = torch
        self.live = [t for t in net.state_dict().values() if t.is_floating_point()]
        self.avg = [t.clone() for t in self.live]
        self.foreach = hasattr(torch, "_foreach_lerp_") and hasattr(torch, "_foreach_copy_")

    def update(self, decay):
        if self.foreach:
            self.torch._foreach_lerp_(self.avg, self.live, 1 - decay)
            self.torch._foreach_copy_(self.live, self.avg)
            return
        for a, t in zip(self.avg, self.live):
            a.lerp_(t, 1 - decay)
            t.copy_(a)


# --- batches -------------------------------------------------------------------

def pad_images(torch, u8, pad):
    """uint8 [N, 3, 32, 32] (numpy) -> uint8 [N, 32 + 2 pad, 32 + 2 pad, 3]
    (torch, channels last), reflect-padded. Reflect padding commutes with the
    per-channel normalisation, so the set stays uint8 (numpy's 'reflect' is
    PyTorch's)."""
    padded = np.pad(u8, ((0, 0), (0, 0), (pad, pad), (pad, pad)), mode="reflect")
    return torch.from_numpy(np.ascontiguousarray(padded.transpose(0, 2, 3, 1)))


def crop_flip(torch, padded, idx, shift, flip, ar):
    """The training batch of images idx, each cut from its padded image
    (uint8 [N, H + 2p, W + 2p, 3]) at its offset shift[b] = (row, col) in
    [0, 2p] and mirrored where flip[b]: uint8 [B, 3, 32, 32], channels-last
    strides (a view of one gather). out[b, c, i, j] =
    padded[idx[b], shift[b, 0] + i, flip[b] ? shift[b, 1] + 31 - j :
    shift[b, 1] + j, c]: airbench's translate then flip. Works on any
    device; idx, shift, flip and ar (arange(32)) on padded's."""
    rows = shift[:, 0:1] + ar                                          # [B, 32]
    cols = torch.where(flip[:, None], shift[:, 1:2] + 31 - ar, shift[:, 1:2] + ar)
    x = padded[idx[:, None, None], rows[:, :, None], cols[:, None, :]]  # [B, 32, 32, 3]
    return x.permute(0, 3, 1, 2)


def epoch_draws(torch, n, pad, base_flip, epoch):
    """An epoch's order, offsets and flips, drawn on the CPU from torch's
    default generator (the same draws on either device for one seed):
    randperm(n), randint(0, 2 pad + 1, [n, 2]), and base_flip (each image's
    flip in even epochs) inverted in odd epochs: the alternating flip."""
    perm = torch.randperm(n)
    shifts = torch.randint(0, 2 * pad + 1, (n, 2))
    return perm, shifts, base_flip ^ bool(epoch % 2)


# --- the run -----------------------------------------------------------------

def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_data = os.path.join(os.environ.get("CNNFLOW_DATA_DIR", os.path.join(ROOT, "data")), "cifar10-jpeg")
    ap.add_argument("--data", default=default_data)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=float, default=RECIPE["epochs"])
    ap.add_argument("--subset", type=int, default=None)
    ap.add_argument("--batch", type=int, default=RECIPE["batch"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.precision == "fp16" and args.device == "cpu":
        ap.error("--precision fp16 is for --device cuda (on the CPU PyTorch emulates it); fp32 or bf16 here")
    return args


def load_data(torch, args, device):
    """Decodes both splits and puts them where they train: the padded
    training set uint8 [N, 36, 36, 3], its labels, the test set uint8
    [M, 32, 32, 3] and its labels, on `device`. Returns them and the decode's
    seconds (data_s)."""
    t = time.perf_counter()
    for split in ("train", "test"):
        if not os.path.isdir(os.path.join(args.data, split)):
            raise SystemExit(f"airbench_pytorch.py: no {os.path.join(args.data, split)} "
                             "(--data DIR: the cifar10-jpeg/{train,test}/<class>/<n>.jpg folder)")
    train_u8, train_y, classes = decode_split(os.path.join(args.data, "train"), args.threads, args.subset)
    test_u8, test_y, test_classes = decode_split(os.path.join(args.data, "test"), args.threads)
    if classes != test_classes:
        raise SystemExit(f"airbench_pytorch.py: train classes {classes} != test classes {test_classes}")
    data_s = time.perf_counter() - t
    train_pad = pad_images(torch, train_u8, RECIPE["translate"]).to(device)
    test_x = torch.from_numpy(np.ascontiguousarray(test_u8.transpose(0, 2, 3, 1))).to(device)
    return (train_pad, torch.from_numpy(train_y).to(device), test_x,
            torch.from_numpy(test_y).to(device)), data_s


def train_step(F, model, opt, x, y, autocast):
    """One step of the recipe (airbench's summed, label-smoothed loss): the logits and the loss."""
    with autocast:
        out = model(x)
    loss = F.cross_entropy(out.float(), y, label_smoothing=RECIPE["label_smoothing"], reduction="sum")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return out, loss


def warm_up(torch, F, net, model, device, autocast, batch, eval_sizes, steps=2):
    """Runs every variant the timed run will call, `steps` times each, on
    random data (a generator of its own: the run's draws do not move):
    training steps with the whitening bias trained and frozen, evaluation
    forwards at each evaluation batch size with no tensor requiring a
    gradient (as main evaluates). torch.compile compiles each variant here
    (it guards on requires_grad and the grad mode: any other state would
    compile again inside the timed span), cuDNN searches its algorithms
    here. Then the network's weights, buffers and requires_grad flags are
    put back as they were."""
    saved = {k: v.detach().clone() for k, v in net.state_dict().items()}
    gen = torch.Generator().manual_seed(0x5EED)
    cl = torch.channels_last

    def images(count):
        return torch.randn(count, 3, 32, 32, generator=gen).to(device).contiguous(memory_format=cl)

    x, y = images(batch), torch.randint(0, 10, (batch,), generator=gen).to(device)
    trains = [(p, p.requires_grad) for p in net.parameters()]
    opt, _ = make_optimizer(torch, net)
    net.train()
    for bias_trains in (True, False):
        net.whiten.bias.requires_grad_(bias_trains)
        for _ in range(steps):
            train_step(F, model, opt, x, y, autocast)
    net.eval()
    net.requires_grad_(False)  # as evaluate's caller: one variant, whatever trained last
    with torch.inference_mode(), autocast:
        for count in eval_sizes:
            xe = images(count)
            for _ in range(steps):
                model(xe)
    net.train()
    for p, trained in trains:
        p.requires_grad_(trained)
    net.load_state_dict(saved)
    for p in net.parameters():
        p.grad = None


def evaluate(torch, F, model, test_x, test_labels, normalise, autocast):
    """Accuracy without TTA and with airbench's level 2 (mirror, and
    one-pixel translations up-left and down-right with reflect padding: 6
    views, logits averaged with weights 1/4 for the two untranslated views
    and 1/8 for each of the four translated), in %, from one pass."""
    cl = torch.channels_last
    correct = torch.zeros((), dtype=torch.int64, device=test_labels.device)
    correct_tta = torch.zeros_like(correct)

    def mirror(v):
        plain = model(v).float()
        return plain, 0.5 * plain + 0.5 * model(v.flip(-1).contiguous(memory_format=cl)).float()

    with torch.inference_mode(), autocast:
        for xs, ys in zip(test_x.split(EVAL_BATCH), test_labels.split(EVAL_BATCH)):
            xs = normalise(xs.permute(0, 3, 1, 2))
            plain, logits = mirror(xs)
            padded = F.pad(xs, (1, 1, 1, 1), mode="reflect")
            shifted = [mirror(padded[:, :, 0:32, 0:32].contiguous(memory_format=cl))[1],
                       mirror(padded[:, :, 2:34, 2:34].contiguous(memory_format=cl))[1]]
            tta = 0.5 * logits + 0.25 * (shifted[0] + shifted[1])
            correct += (plain.argmax(1) == ys).sum()
            correct_tta += (tta.argmax(1) == ys).sum()
    n = len(test_labels)
    return 100.0 * correct.item() / n, 100.0 * correct_tta.item() / n


EVAL_BATCH = 2000


def main():
    args = parse_args()
    RECIPE["batch"] = args.batch

    import torch
    from torch import nn
    import torch.nn.functional as F

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit(f"airbench_pytorch.py: --device cuda, but torch {torch.__version__} sees no GPU "
                         f"(built for CUDA {torch.version.cuda})")
    device = torch.device("cuda:0" if cuda else "cpu")

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if cuda:
        torch.backends.cudnn.benchmark = True
    isa = cpu_isa()
    gpu = torch.cuda.get_device_name(device) if cuda else ""
    if args.precision == "bf16" and not cuda and "avx512_bf16" not in isa and "amx_bf16" not in isa:
        log(f"warning: bf16 on a CPU without avx512_bf16/amx_bf16 ({isa}): PyTorch emulates it")
    log(f"torch {torch.__version__}, {args.device}{' (' + gpu + ')' if gpu else ''}, {args.threads} threads, "
        f"{args.precision}{', compiled' if args.compile else ''}, isa {isa}, seed {args.seed}")

    # Data: decoded once and put where it trains (before the timed span).
    t = time.perf_counter()
    (train_pad, train_labels, test_x, test_labels), data_s = load_data(torch, args, device)
    sync()
    decode_s = time.perf_counter() - t
    n = len(train_labels)
    log(f"decoded {n} training and {len(test_labels)} test images in {data_s:.1f}s"
        f"{f', on the GPU after {decode_s:.1f}s' if cuda else ''}")
    mean = torch.tensor(CIFAR_MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(CIFAR_STD, device=device).view(1, 3, 1, 1) * 255

    def normalise(u8):  # uint8 [B, 3, H, W] -> float, channels-last
        return ((u8.float() - mean) / std).contiguous(memory_format=torch.channels_last)

    # The network (the weights drawn on the CPU: the same for a seed on
    # either device), compiled and warmed up before the span where asked.
    net = build_net(torch, nn).to(device=device, memory_format=torch.channels_last)
    model = torch.compile(net, dynamic=False) if args.compile else net
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    # fp32: autocast off (its dtype then only needs to be one the device
    # takes, or torch warns).
    autocast = torch.autocast(args.device, dtype=dtype or torch.bfloat16, enabled=dtype is not None)
    batch = args.batch
    compile_s = 0.0
    if args.compile or cuda:
        t = time.perf_counter()
        eval_sizes = sorted({min(EVAL_BATCH, len(test_labels)), len(test_labels) % EVAL_BATCH} - {0})
        warm_up(torch, F, net, model, device, autocast, batch, eval_sizes)
        sync()
        compile_s = time.perf_counter() - t
        log(f"{'compile and ' if args.compile else ''}warm-up: {compile_s:.1f}s (outside the timed span)")
    opt, (lr, lr_bias, wd) = make_optimizer(torch, net)

    steps_per_epoch = n // batch  # the last partial batch of each epoch is dropped
    if steps_per_epoch == 0:
        raise SystemExit(f"airbench_pytorch.py: {n} training images, fewer than a batch of {batch}")
    total_steps = math.ceil(steps_per_epoch * args.epochs)
    log(f"{n} images, batch {batch}: {steps_per_epoch} steps per epoch, {total_steps} steps in "
        f"{args.epochs} epochs; lr {lr:.6g} (BN biases {lr_bias:.6g}), decay per step {wd:.6g}")

    # The timed span: whitening init, training, TTA evaluation.
    sync()
    t_span = time.perf_counter()
    pad = RECIPE["translate"]
    init_whitening(torch, net.whiten,
                   normalise(train_pad[:RECIPE["whiten_images"], pad:pad + 32, pad:pad + 32].permute(0, 3, 1, 2)))
    base_flip = torch.rand(n) < 0.5  # each image's flip in even epochs; odd epochs flip them all
    ar = torch.arange(32, device=device)
    r = RECIPE
    lookahead = None
    step = 0
    net.train()
    for epoch in range(math.ceil(args.epochs)):
        if step >= total_steps:
            break
        t_epoch = time.perf_counter()
        net.whiten.bias.requires_grad_(epoch < r["whiten_bias_epochs"])
        perm, shifts, flip = (v.to(device) for v in epoch_draws(torch, n, pad, base_flip, epoch))
        for i in range(steps_per_epoch):
            idx = perm[i * batch:(i + 1) * batch]
            x = normalise(crop_flip(torch, train_pad, idx, shifts[idx], flip[idx], ar))
            y = train_labels[idx]
            f = lr_factor(step, total_steps)
            for g in opt.param_groups:
                g["lr"] = g["base_lr"] * f
            out, loss = train_step(F, model, opt, x, y, autocast)
            step += 1
            if epoch >= r["ema_start_epoch"] and step % r["ema_every"] == 0:
                if lookahead is None:
                    lookahead = Lookahead(torch, net)
                else:
                    decay = r["ema_decay_base"] ** r["ema_every"] * (step / total_steps) ** r["ema_decay_pow"]
                    lookahead.update(decay)
            if step >= total_steps:
                break
        if lookahead is not None:
            lookahead.update(1.0)  # end of epoch: the network takes the average
        acc = (out.argmax(1) == y).float().mean().item() * 100  # synchronises: one wait an epoch
        log(f"epoch {epoch + 1}/{math.ceil(args.epochs)}: step {step}/{total_steps}, last batch loss "
            f"{loss.item() / len(y):.4f}, accuracy {acc:.1f}%, {time.perf_counter() - t_epoch:.1f}s")
    sync()
    train_s = time.perf_counter() - t_span

    t = time.perf_counter()
    net.eval()
    # Training is over: no tensor needs a gradient (torch.compile guards on
    # requires_grad; the warm-up compiled the evaluation so).
    net.requires_grad_(False)
    accuracy, accuracy_tta = evaluate(torch, F, model, test_x, test_labels, normalise, autocast)
    sync()
    t_end = time.perf_counter()
    eval_s, timed_s, wall_s = t_end - t, t_end - t_span, t_end - T0
    log(f"test accuracy {accuracy:.2f}%, with TTA {accuracy_tta:.2f}% of {len(test_labels)} images; "
        f"timed span {timed_s:.2f}s (train {train_s:.2f}s, eval {eval_s:.2f}s); wall {wall_s:.1f}s "
        f"(decode {decode_s:.1f}s, compile and warm-up {compile_s:.1f}s)")
    result = {"seed": args.seed, "device": args.device, "gpu": gpu, "precision": args.precision,
              "compile": args.compile, "threads": args.threads, "epochs": args.epochs,
              "accuracy": round(accuracy, 2), "accuracy_tta": round(accuracy_tta, 2),
              "timed_s": round(timed_s, 3), "train_s": round(train_s, 3), "eval_s": round(eval_s, 3),
              "decode_s": round(decode_s, 2), "data_s": round(data_s, 2), "compile_s": round(compile_s, 2),
              "wall_s": round(wall_s, 2), "torch": torch.__version__, "isa": isa,
              "cudnn": torch.backends.cudnn.version() if cuda else None,
              "train_images": n, "test_images": len(test_labels), "batch": batch, "steps": total_steps}
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        print(" ".join(f"{k}={v}" for k, v in result.items()), flush=True)


if __name__ == "__main__":
    main()
