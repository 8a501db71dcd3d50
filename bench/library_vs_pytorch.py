#!/usr/bin/env python3
"""Every model of cnnflow's library against PyTorch on the same weights.

For each network: PyTorch (torchvision's definition, or the 1D references
below, written from the papers) gets random weights with non-trivial batch
norm statistics, layer scales and affine maps (dropout and stochastic depth
off); they go to safetensors with the state_dict's names, and cnnflow loads
them strictly (`cnnflow models NAME --weights W --check IN -o OUT`). The
reference is PyTorch in float64 on those same values (the exact answer:
PyTorch's own f32 gradients of deep nets with training-mode BN are off it by
up to ~6e-2 at batch 2, a column shows by how much). Compared:
  - logits in evaluation mode: ||cnnflow - torch|| / ||torch||;
  - one training-mode step (BN on batch statistics): the logits, and every
    parameter gradient of the mean cross-entropy, each relative to its norm
    (at least 1e-5 of the largest gradient's: see GRAD_FLOOR);
  - the same in float64 (`--check --f64`): cnnflow's f64 must equal
    PyTorch's to 1e-7 (1e-11..1e-14 where no hardsigmoid: PyTorch's f64
    hardsigmoid gradient uses a float 1/6), the proof that the mathematics
    is the same;
  - f32 passes at 1e-4, or, where the network's f32 gradients are
    ill-conditioned, within twice PyTorch's own f32 error.
  - ONNX: the network exported by `cnnflow export` and run by onnxruntime,
    against PyTorch's eval logits (where onnxruntime is installed).
Prints a Markdown table (and writes it with --out). Runs in the git-ignored
venv of bench/torch_venv.sh (torch, torchvision, safetensors; onnxruntime for
the ONNX column), never in CI:

  $(bench/torch_venv.sh) bench/library_vs_pytorch.py [--models a,b] [--out FILE]
"""
import argparse
import copy
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-4
# A tensor whose true gradient is (near) zero, e.g. the bias of a batch norm
# that another batch norm follows (training-mode BN removes any per-channel
# constant), has only rounding noise as its gradient in f32; its error is
# taken relative to this fraction of the largest gradient's norm instead.
GRAD_FLOOR = 1e-5
F64_TOL = 1e-7


# ---------------------------------------------------------------- 1D references
# Written from the papers (Wang et al. 2017; Ismail Fawaz et al. 2020) with
# tsai's choices for odd kernels (models/timeseries.yaml says which); the
# module names are the layer names of models/timeseries.yaml.

class ConvBnRelu1d(nn.Module):
    def __init__(self, ni, nf, k, act=True):
        super().__init__()
        self.conv = nn.Conv1d(ni, nf, k, padding=k // 2, bias=False)
        self.bn = nn.BatchNorm1d(nf)
        self.act = act

    def forward(self, x):
        x = self.bn(self.conv(x))
        return F.relu(x) if self.act else x


class FCN(nn.Module):
    def __init__(self, c_in, classes):
        super().__init__()
        self.convblock1 = ConvBnRelu1d(c_in, 128, 7)
        self.convblock2 = ConvBnRelu1d(128, 256, 5)
        self.convblock3 = ConvBnRelu1d(256, 128, 3)
        self.fc = nn.Linear(128, classes)

    def forward(self, x):
        x = self.convblock3(self.convblock2(self.convblock1(x)))
        return self.fc(x.mean(-1))


class ResBlock1d(nn.Module):
    def __init__(self, ni, nf):
        super().__init__()
        self.convblock1 = ConvBnRelu1d(ni, nf, 7)
        self.convblock2 = ConvBnRelu1d(nf, nf, 5)
        self.convblock3 = ConvBnRelu1d(nf, nf, 3, act=False)
        self.project = ni != nf
        self.shortcut = ConvBnRelu1d(ni, nf, 1, act=False) if self.project else nn.Module()
        if not self.project:
            self.shortcut.bn = nn.BatchNorm1d(ni)

    def forward(self, x):
        y = self.convblock3(self.convblock2(self.convblock1(x)))
        s = self.shortcut(x) if self.project else self.shortcut.bn(x)
        return F.relu(y + s)


class ResNet1d(nn.Module):
    def __init__(self, c_in, classes, width=64):
        super().__init__()
        self.resblock1 = ResBlock1d(c_in, width)
        self.resblock2 = ResBlock1d(width, 2 * width)
        self.resblock3 = ResBlock1d(2 * width, 2 * width)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = self.resblock3(self.resblock2(self.resblock1(x)))
        return self.fc(x.mean(-1))


class InceptionModule(nn.Module):
    def __init__(self, ni, nf=32, bottleneck=True):
        super().__init__()
        self.use_bottleneck = bottleneck
        if bottleneck:
            self.bottleneck = nn.Conv1d(ni, nf, 1, bias=False)
        b = nf if bottleneck else ni
        self.convs = nn.ModuleList([nn.Conv1d(b, nf, k, padding=k // 2, bias=False) for k in (39, 19, 9)])
        self.maxconvpool = nn.Sequential(nn.MaxPool1d(3, 1, padding=1), nn.Conv1d(ni, nf, 1, bias=False))
        self.bn = nn.BatchNorm1d(4 * nf)

    def forward(self, x):
        b = self.bottleneck(x) if self.use_bottleneck else x
        y = torch.cat([c(b) for c in self.convs] + [self.maxconvpool(x)], 1)
        return F.relu(self.bn(y))


class InceptionTime(nn.Module):
    def __init__(self, c_in, classes, nf=32):
        super().__init__()
        self.inception = nn.ModuleList(
            [InceptionModule(c_in if d == 0 else 4 * nf, nf, bottleneck=(d > 0 or c_in > 1)) for d in range(6)])
        self.shortcut = nn.ModuleList([nn.Sequential(nn.Conv1d(c_in, 4 * nf, 1, bias=False), nn.BatchNorm1d(4 * nf)),
                                       nn.BatchNorm1d(4 * nf)])
        self.fc = nn.Linear(4 * nf, classes)

    def forward(self, x):
        res = x
        for d in range(6):
            x = self.inception[d](x)
            if d % 3 == 2:
                res = x = F.relu(x + self.shortcut[d // 3](res))
        return self.fc(x.mean(-1))


# ---------------------------------------------------------------- the networks

def resnet18_cifar(classes):
    import torchvision
    m = torchvision.models.resnet18(num_classes=classes)
    m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    m.maxpool = nn.Identity()
    return m


def tv(name):
    def make(classes):
        import torchvision
        return getattr(torchvision.models, name)(num_classes=classes)
    return make


# name: (constructor(classes), input shape, cnnflow options, batch)
MODELS = {
    "resnet18": (tv("resnet18"), (3, 224, 224), [], 2),
    "resnet34": (tv("resnet34"), (3, 224, 224), [], 2),
    "resnet50": (tv("resnet50"), (3, 224, 224), [], 2),
    "resnet101": (tv("resnet101"), (3, 224, 224), [], 2),
    "resnext50_32x4d": (tv("resnext50_32x4d"), (3, 224, 224), [], 2),
    "resnet18_cifar": (resnet18_cifar, (3, 32, 32), [], 4),
    "vgg11_bn": (tv("vgg11_bn"), (3, 224, 224), ["dropout=0"], 2),
    "mobilenet_v2": (tv("mobilenet_v2"), (3, 224, 224), ["dropout=0"], 2),
    "mobilenet_v3_small": (tv("mobilenet_v3_small"), (3, 224, 224), ["dropout=0"], 2),
    "efficientnet_b0": (tv("efficientnet_b0"), (3, 224, 224), ["dropout=0", "stochastic_depth=0"], 2),
    "convnext_tiny": (tv("convnext_tiny"), (3, 224, 224), ["stochastic_depth=0"], 2),
    "densenet121": (tv("densenet121"), (3, 224, 224), [], 2),
    "fcn": (lambda k: FCN(3, k), (3, 128), ["in_channels=3"], 4),
    "resnet1d": (lambda k: ResNet1d(3, k), (3, 128), ["in_channels=3"], 4),
    "inception_time": (lambda k: InceptionTime(3, k), (3, 128), ["in_channels=3"], 4),
}


def randomise(model, gen):
    """Random affine maps, BN statistics and layer scales; dropout and stochastic depth off."""
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)):
                mod.weight.uniform_(0.5, 1.5, generator=gen)
                mod.bias.uniform_(-0.2, 0.2, generator=gen)
                mod.running_mean.uniform_(-0.2, 0.2, generator=gen)
                mod.running_var.uniform_(0.5, 2.0, generator=gen)
            elif isinstance(mod, nn.LayerNorm) or type(mod).__name__ == "LayerNorm2d":
                mod.weight.uniform_(0.5, 1.5, generator=gen)
                mod.bias.uniform_(-0.2, 0.2, generator=gen)
            elif isinstance(mod, nn.Dropout):
                mod.p = 0.0
            elif type(mod).__name__ == "StochasticDepth":
                mod.p = 0.0
        for name, p in model.named_parameters():
            if name.endswith("layer_scale"):
                p.uniform_(0.2, 1.0, generator=gen)


def rel(a, b, floor=1e-30):
    """||a - b|| / ||b||, with ||b|| at least `floor`."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), floor))


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{r.stdout}{r.stderr}")
    return r.stdout


def check(name, cnnflow, tmp, classes=10):
    from safetensors.numpy import load_file, save_file
    make, shape, options, batch = MODELS[name]
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = make(classes).float()
    randomise(model, gen)
    state = {k: v.detach().contiguous().numpy() for k, v in model.state_dict().items()
             if not k.endswith("num_batches_tracked")}
    weights = os.path.join(tmp, f"{name}.safetensors")
    save_file(state, weights)
    x = torch.randn((batch,) + shape, generator=gen)
    labels = torch.randint(0, classes, (batch,), generator=gen)
    inp = os.path.join(tmp, f"{name}.in.safetensors")
    save_file({"input": x.numpy(), "labels": labels.float().numpy()}, inp)

    def run_torch(m, xin):  # eval logits, train logits, gradients
        m.eval()
        with torch.no_grad():
            ev = m(xin).double().numpy()
        m.train()
        m.zero_grad()
        lo = m(xin)
        F.cross_entropy(lo, labels).backward()
        return ev, lo.detach().double().numpy(), {n: p.grad.double().numpy() for n, p in m.named_parameters()}
    # The reference is PyTorch in float64 on the same (f32) values: the exact
    # answer, so cnnflow's f32 and PyTorch's own f32 are measured against it.
    m64 = copy.deepcopy(model).double()
    ref_eval, ref_train, grads = run_torch(m64, x.double())
    t32_eval, t32_train, t32_grads = run_torch(model, x)
    floor = GRAD_FLOOR * max(np.linalg.norm(g) for g in grads.values())

    out = os.path.join(tmp, f"{name}.out.safetensors")
    sets = [a for o in [f"classes={classes}"] + options for a in ("--set", o)]
    t0 = time.time()
    run([cnnflow, "models", name, *sets, "--weights", weights, "--check", inp, "-o", out])
    seconds = time.time() - t0
    got = load_file(out)
    # cnnflow in float64 against PyTorch in float64: the same mathematics.
    run([cnnflow, "models", name, *sets, "--weights", weights, "--check", inp, "-o", out + "64", "--f64"])
    got64 = load_file(out + "64")
    f64 = max([rel(got64["logits"], ref_eval), rel(got64["logits_train"], ref_train)] +
              [rel(got64["grad." + n], g, floor) for n, g in grads.items()])
    row = {"name": name, "eval": rel(got["logits"], ref_eval), "train": rel(got["logits_train"], ref_train),
           "grad": 0.0, "worst": "", "tensors": len(grads), "seconds": seconds, "f64": f64,
           "torch32": max([rel(t32_eval, ref_eval), rel(t32_train, ref_train)] +
                          [rel(t32_grads[n], g, floor) for n, g in grads.items()])}
    missing = [n for n in grads if "grad." + n not in got]
    if missing:
        raise RuntimeError(f"{name}: cnnflow has no gradient for {missing[:5]}")
    for n, g in grads.items():
        e = rel(got["grad." + n], g, floor)
        if e >= row["grad"]:
            row["grad"], row["worst"] = e, n
    row["onnx"] = onnx_check(name, cnnflow, tmp, weights, x, ref_eval, classes, options, shape)
    return row


def onnx_check(name, cnnflow, tmp, weights, x, ref_eval, classes, options, shape):
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    config = os.path.join(tmp, f"{name}.yaml")
    with_ = ", ".join([f"classes: {classes}"] + [o.replace("=", ": ") for o in options])
    with open(config, "w") as f:
        f.write(f"name: {name}\ndata:\n  train: {{source: synthetic, shape: {list(shape)}, classes: {classes}, size: 8}}\n"
                f"model: {{library: {name}, with: {{{with_}}}}}\n"
                f"train: {{epochs: 1, batch: 2, optimizer: {{sgd: {{lr: 0.01}}}}}}\n")
    onnx = os.path.join(tmp, f"{name}.onnx")
    run([cnnflow, "export", config, "--weights", weights, "-o", onnx])
    sess = ort.InferenceSession(onnx, providers=["CPUExecutionProvider"])
    y = sess.run(None, {"input": x.numpy()})[0]
    return rel(y, ref_eval)


def isa():
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    for f in ("amx_tile", "avx512_bf16", "avx512f", "avx2"):
        if f in flags:
            return f
    return platform.machine()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--cnnflow", default=os.path.join(ROOT, "build", "cnnflow"))
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(2)
    import torchvision
    lines = [f"cnnflow library vs PyTorch {torch.__version__} / torchvision {torchvision.__version__}, "
             f"same weights; ISA {isa()}; tolerance {TOL:g} (norm-relative)", "",
             "| model | eval logits | train logits | worst grad (tensor) | grads | ONNX (onnxruntime) | PyTorch f32's own worst | cnnflow f64 vs PyTorch f64 | cnnflow s | pass |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    print("\n".join(lines), flush=True)
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            try:
                r = check(name, a.cnnflow, tmp)
            except Exception as e:  # one model's failure is a row, not the end of the table
                line = f"| {name} | error: {str(e).strip().splitlines()[-1][:160]} | | | | | | | | FAIL |"
                failed.append(name)
            else:
                # f64 equal to PyTorch's f64 (the same mathematics), and f32
                # within TOL of the exact answer or, where the network's f32
                # gradients are ill-conditioned (training-mode BN over few
                # values), within twice PyTorch's own f32 error.
                f32 = max(r["eval"], r["train"], r["grad"])
                ok = (r["f64"] <= F64_TOL and (f32 <= TOL or f32 <= 2 * r["torch32"]) and
                      (r["onnx"] is None or r["onnx"] <= TOL))
                if not ok:
                    failed.append(name)
                onnx = "n/a" if r["onnx"] is None else f"{r['onnx']:.1e}"
                line = (f"| {name} | {r['eval']:.1e} | {r['train']:.1e} | {r['grad']:.1e} ({r['worst']}) | "
                        f"{r['tensors']} | {onnx} | {r['torch32']:.1e} | {r['f64']:.1e} | {r['seconds']:.1f} | "
                        f"{'yes' if ok else 'FAIL'} |")
            lines.append(line)
            print(line, flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
