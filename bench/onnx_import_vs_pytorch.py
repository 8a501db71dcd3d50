#!/usr/bin/env python3
"""`cnnflow import` on PyTorch's ONNX files, against PyTorch.

For each of torchvision's resnet50, mobilenet_v2 and efficientnet_b0
(weights=None, then random weights with non-trivial batch norm statistics
and affine maps, dropout and stochastic depth off: randomise of
bench/library_vs_pytorch.py), at 224x224:
  1. PyTorch's TorchScript exporter writes the network to ONNX (export_onnx:
     eval mode, BatchNormalization kept with its running statistics, no
     constant folding, so the initializers keep the state_dict's names);
  2. `cnnflow import X.onnx -o DIR` makes DIR/model.yaml and
     DIR/model.safetensors (timed); the weights must be the state_dict's,
     by name, bit for bit;
  3. `cnnflow models DIR/model.yaml --weights DIR/model.safetensors --check
     IN -o OUT` on IN's "input" [B, 3, 224, 224] and "labels" [B] (f32);
  4. against PyTorch in float64 on the same f32 weights (the exact answer,
     as bench/library_vs_pytorch.py measures): the eval logits
     (||cnnflow - torch|| / ||torch|| <= 1e-4); one training-mode step (BN
     on batch statistics): the logits and every parameter gradient of the
     mean cross-entropy, each relative to its norm (at least GRAD_FLOOR of
     the largest's), <= 1e-4 or within twice PyTorch's own f32 error; every
     parameter's gradient found by its PyTorch name, none other;
  5. onnxruntime on the exported file against the same reference (a column
     for scale: what a runtime makes of the file);
  7. (--dynamo, on by default) the newer exporter's file (dynamo=True,
     onnxscript from PyPI; its optimiser folds BN into the convs):
     imported, its eval logits and the round trip against PyTorch f64;
  (--f64: the same check run in float64, `--check --f64`, must equal
     PyTorch's float64 to 1e-7: the same mathematics;)
  the imported weights load strictly into the library network of the same
     name (`cnnflow models NAME --weights DIR/model.safetensors --check`):
     its eval logits against PyTorch's (<= 1e-4);
  6. (--roundtrip, on by default) `cnnflow export DIR/model.yaml --weights
     DIR/model.safetensors -o RT.onnx` in onnxruntime: its logits against
     PyTorch's eval logits (<= 1e-4).
Prints a Markdown table (and writes it with --out); exits 1 if any check
fails. A model whose import (or check) fails is a failed row, with the
command's stderr printed, and the next model runs.

Runs in the git-ignored venv of bench/torch_venv.sh (torch, torchvision,
onnx, onnxruntime, safetensors; onnxscript for --dynamo), never in CI:

  $(bench/torch_venv.sh) bench/onnx_import_vs_pytorch.py [--models a,b | all] [--batch 2]
      [--cnnflow build/cnnflow] [--no-roundtrip] [--f64] [--keep DIR] [--out FILE]
  $(bench/torch_venv.sh) bench/onnx_import_vs_pytorch.py --export-only   # PyTorch and onnxruntime only
"""
import argparse
import collections
import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from library_vs_pytorch import F64_TOL, GRAD_FLOOR, TOL, randomise, rel  # noqa: E402

MODELS = ["resnet50", "mobilenet_v2", "efficientnet_b0"]
# --models all: torchvision's CNN classifiers (issue 57's list).
ALL_MODELS = ["alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_v2_s",
              "googlenet", "inception_v3", "mnasnet0_5", "mobilenet_v2", "mobilenet_v3_large",
              "mobilenet_v3_small", "regnet_y_400mf", "resnet18", "resnet50", "resnext50_32x4d",
              "shufflenet_v2_x0_5", "squeezenet1_1", "vgg11_bn", "wide_resnet50_2"]
# Constructor arguments where the defaults do not give one logits tensor in
# training mode (the auxiliary classifiers return a tuple there).
MODEL_KWARGS = {"googlenet": {"aux_logits": False, "init_weights": True},
                "inception_v3": {"aux_logits": False, "init_weights": True}}
SHAPE = (3, 224, 224)
INPUT = {"inception_v3": (3, 299, 299)}  # networks trained at another size


def export_onnx(model, x, path, folded=False):
    """The exporter settings of cnnflow's ONNX tests and benches: PyTorch's
    TorchScript exporter, opset 17, input "input", output "logits", dynamic
    batch; eval mode with BatchNormalization kept (PRESERVE, no constant
    folding: the initializers keep the state_dict's names), or folded
    (EVAL, constant folding: BN folded into the convs, the exporter's
    names, onnx::Conv_NN)."""
    model.eval()
    with warnings.catch_warnings():  # the TorchScript exporter is deprecated; users' files come from it
        warnings.simplefilter("ignore")
        torch.onnx.export(model, x, path, dynamo=False,
                          training=torch.onnx.TrainingMode.EVAL if folded else torch.onnx.TrainingMode.PRESERVE,
                          do_constant_folding=folded, input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}}, opset_version=17)


def export_onnx_dynamo(model, x, path):
    """The newer exporter (dynamo=True; onnxscript from PyPI), as a user
    calls it: eval mode, its default graph optimisation (which folds
    BatchNormalization into the convs), weights inside the file."""
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), path, dynamo=True, input_names=["input"], output_names=["logits"],
                          external_data=False)


def machine():
    """The CPU and its ISA flags, as bench/before_after.sh prints them."""
    text = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    name = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    have = set(flags.group(1).split()) if flags else set()
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in have]
    return (f"# machine: {name.group(1).strip() if name else 'unknown'}, ISA flags: {' '.join(isa) or 'none'}, "
            f"{os.cpu_count()} cores")


def run(cmd):
    """(seconds, stdout); RuntimeError with the command's stderr if it fails."""
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.time() - t0
    if r.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` exited {r.returncode}\n{r.stdout}{r.stderr}".rstrip())
    return seconds, r.stdout


def count_layers(config):
    """Layers of a run config's model section: its `name:` entries (the
    top-level `name:` is the run's and is not counted); None if none."""
    n, inside = 0, False
    for line in open(config):
        if re.match(r"^\S", line):  # a top-level key
            inside = line.startswith("model:")
            continue
        if inside:
            n += len(re.findall(r"(?:^|[\s{,])name:\s", line.split("#", 1)[0]))
    return n or None


def onnx_logits(path, x):
    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x})[0]


def torch_step(m, x, labels):
    """Eval logits, training-mode logits and every parameter's gradient of
    the mean cross-entropy (the model's BN statistics move: a copy)."""
    m.eval()
    with torch.no_grad():
        ev = m(x).double().numpy()
    m.train()
    m.zero_grad()
    lo = m(x)
    F.cross_entropy(lo, labels).backward()
    return ev, lo.detach().double().numpy(), {n: p.grad.double().numpy() for n, p in m.named_parameters()}


def check(name, a, tmp):
    import onnx
    import torchvision
    from safetensors.numpy import load_file, save_file
    row = {"name": name}
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = getattr(torchvision.models, name)(weights=None, **MODEL_KWARGS.get(name, {})).float()
    randomise(model, gen)  # also every nn.Dropout's p and StochasticDepth's p to 0
    x = torch.randn((a.batch,) + INPUT.get(name, SHAPE), generator=gen)
    labels = torch.randint(0, 1000, (a.batch,), generator=gen)
    state = {k: v.detach().contiguous().numpy() for k, v in model.state_dict().items()
             if not k.endswith("num_batches_tracked")}

    # 1. Export, before any training-mode forward moves the BN statistics.
    path = os.path.join(tmp, f"{name}.onnx")
    export_onnx(copy.deepcopy(model), x, path)
    graph = onnx.load(path).graph
    row["nodes"] = len(graph.node)
    ops = collections.Counter(n.op_type for n in graph.node)
    print(f"  {name}: {len(graph.node)} nodes {dict(ops)}, {len(graph.initializer)} initializers, "
          f"{os.path.getsize(path) / 1e6:.1f} MB", flush=True)

    # 2. Import (before the reference: a failed import costs no float64 pass).
    if not a.export_only:
        out_dir = os.path.join(tmp, f"{name}.import")
        row["import_s"], _ = run([a.cnnflow, "import", path, "-o", out_dir])
        config = os.path.join(out_dir, "model.yaml")
        weights = os.path.join(out_dir, "model.safetensors")
        row["layers"] = count_layers(config)
        got_w = load_file(weights)
        row["weights_equal"] = sum(1 for k, v in state.items()
                                   if k in got_w and got_w[k].shape == v.shape and
                                   np.array_equal(got_w[k].astype(np.float32), v))
        row["weights"] = len(state)
        row["weights_extra"] = sorted(set(got_w) - set(state))

    # The reference: PyTorch in float64 on the same f32 values; PyTorch's f32 too.
    ref_eval, ref_train, grads = torch_step(copy.deepcopy(model).double(), x.double(), labels)
    t32_eval, t32_train, t32_grads = torch_step(copy.deepcopy(model), x, labels)
    floor = GRAD_FLOOR * max(np.linalg.norm(g) for g in grads.values())
    row["torch_within"] = sum(rel(t32_grads[n], g, floor) <= TOL for n, g in grads.items())
    row["torch32"] = max([rel(t32_eval, ref_eval), rel(t32_train, ref_train)] +
                         [rel(t32_grads[n], g, floor) for n, g in grads.items()])
    # 5. onnxruntime on the exported file.
    row["ort"] = rel(onnx_logits(path, x.numpy()), ref_eval)
    row["params"] = len(grads)
    if a.export_only:
        return row

    # 3. The check run.
    inp = os.path.join(tmp, f"{name}.in.safetensors")
    save_file({"input": x.numpy(), "labels": labels.float().numpy()}, inp)
    out = os.path.join(tmp, f"{name}.out.safetensors")
    run([a.cnnflow, "models", config, "--weights", weights, "--check", inp, "-o", out])
    got = load_file(out)

    # 4. Against PyTorch.
    row["eval"] = rel(got["logits"], ref_eval)
    row["train"] = rel(got["logits_train"], ref_train)
    row["grad"], row["worst"] = 0.0, ""
    row["matched"] = row["within"] = 0
    for n, g in grads.items():
        if "grad." + n not in got:
            continue
        row["matched"] += 1
        e = rel(got["grad." + n], g, floor)
        row["within"] += e <= TOL
        if e >= row["grad"]:
            row["grad"], row["worst"] = e, n
    row["missing"] = [n for n in grads if "grad." + n not in got]
    row["extra"] = sorted(k[5:] for k in got if k.startswith("grad.") and k[5:] not in grads)
    row["f64"] = None
    if a.f64:
        run([a.cnnflow, "models", config, "--weights", weights, "--check", inp, "-o", out + "64", "--f64"])
        got64 = load_file(out + "64")
        row["f64"] = max([rel(got64["logits"], ref_eval), rel(got64["logits_train"], ref_train)] +
                         [rel(got64["grad." + n], g, floor) for n, g in grads.items() if "grad." + n in got64])

    # The imported weights, by PyTorch's names, load strictly into the
    # library network of the same name: its eval logits against PyTorch's.
    # (Networks the library lacks, ShuffleNet's, have no such column.)
    row["library"] = None
    listing = subprocess.run([a.cnnflow, "models"], capture_output=True, text=True).stdout
    if any(line.split()[:1] == [name] for line in listing.splitlines()):
        out_lib = os.path.join(tmp, f"{name}.library.safetensors")
        run([a.cnnflow, "models", name, "--weights", weights, "--check", inp, "-o", out_lib])
        row["library"] = rel(load_file(out_lib)["logits"], ref_eval)

    # 6. The round trip through cnnflow's exporter.
    row["roundtrip"] = None
    if a.roundtrip:
        rt = os.path.join(tmp, f"{name}.rt.onnx")
        run([a.cnnflow, "export", config, "--weights", weights, "-o", rt])
        row["roundtrip"] = rel(onnx_logits(rt, x.numpy()), ref_eval)
    return row


def check_dynamo(name, a, tmp):
    """The newer exporter's file: imported, its eval logits (BN folded, so
    no training step to compare) and the round trip against PyTorch f64."""
    import torchvision
    from safetensors.numpy import load_file, save_file
    import onnx
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = getattr(torchvision.models, name)(weights=None, **MODEL_KWARGS.get(name, {})).float()
    randomise(model, gen)
    x = torch.randn((a.batch,) + INPUT.get(name, SHAPE), generator=gen)
    labels = torch.randint(0, 1000, (a.batch,), generator=gen)
    path = os.path.join(tmp, f"{name}.dynamo.onnx")
    export_onnx_dynamo(copy.deepcopy(model), x, path)
    row = {"nodes": len(onnx.load(path).graph.node)}
    out_dir = os.path.join(tmp, f"{name}.dynamo.import")
    row["import_s"], _ = run([a.cnnflow, "import", path, "-o", out_dir])
    config, weights = os.path.join(out_dir, "model.yaml"), os.path.join(out_dir, "model.safetensors")
    row["layers"] = count_layers(config)
    inp = os.path.join(tmp, f"{name}.dynamo.in.safetensors")
    save_file({"input": x.numpy(), "labels": labels.float().numpy()}, inp)
    out = os.path.join(tmp, f"{name}.dynamo.out.safetensors")
    run([a.cnnflow, "models", config, "--weights", weights, "--check", inp, "-o", out])
    m = copy.deepcopy(model).double().eval()
    with torch.no_grad():
        ref = m(x.double()).numpy()
    row["eval"] = rel(load_file(out)["logits"], ref)
    row["ort"] = rel(onnx_logits(path, x.numpy()), ref)
    rt = os.path.join(tmp, f"{name}.dynamo.rt.onnx")
    run([a.cnnflow, "export", config, "--weights", weights, "-o", rt])
    row["roundtrip"] = rel(onnx_logits(rt, x.numpy()), ref)
    return row


def verdict(r):
    """(pass, the reasons it fails)."""
    why = []
    if r["eval"] > TOL:
        why.append(f"eval logits {r['eval']:.1e}")
    f32 = max(r["train"], r["grad"])
    if not (f32 <= TOL or f32 <= 2 * r["torch32"]):
        why.append(f"train logits/grads {f32:.1e} (PyTorch f32's own {r['torch32']:.1e})")
    if r["missing"]:
        why.append(f"no gradient for {len(r['missing'])} parameters: {r['missing'][:3]}")
    if r["extra"]:
        why.append(f"{len(r['extra'])} gradients PyTorch has not: {r['extra'][:3]}")
    if r["weights_equal"] != r["weights"] or r["weights_extra"]:
        why.append(f"weights: {r['weights_equal']} of {r['weights']} state_dict tensors equal, "
                   f"{len(r['weights_extra'])} others {r['weights_extra'][:3]}")
    if r["f64"] is not None and r["f64"] > F64_TOL:
        why.append(f"f64 {r['f64']:.1e} (> {F64_TOL:g})")
    if r["library"] is not None and r["library"] > TOL:
        why.append(f"the weights in the library's {r['name']}: logits {r['library']:.1e}")
    if r["roundtrip"] is not None and r["roundtrip"] > TOL:
        why.append(f"round-trip ONNX {r['roundtrip']:.1e}")
    return not why, why


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--cnnflow", default=os.path.join(ROOT, "build", "cnnflow"))
    ap.add_argument("--roundtrip", action=argparse.BooleanOptionalAction, default=True,
                    help="export the imported network again with cnnflow and run it in onnxruntime (default on)")
    ap.add_argument("--f64", action="store_true",
                    help="also run the check in float64: equal to PyTorch's float64 to 1e-7")
    ap.add_argument("--export-only", action="store_true",
                    help="the PyTorch half only: export, the float64 reference, onnxruntime; no cnnflow")
    ap.add_argument("--dynamo", action=argparse.BooleanOptionalAction, default=True,
                    help="also import the newer exporter's files (dynamo=True; needs onnxscript; default on)")
    ap.add_argument("--keep", metavar="DIR", help="keep the ONNX files, imports and check outputs in DIR")
    ap.add_argument("--threads", type=int, default=2, help="PyTorch's threads (default 2)")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.models == "all":
        a.models = ",".join(ALL_MODELS)
    if not a.export_only and not os.access(a.cnnflow, os.X_OK):
        ap.error(f"no cnnflow at {a.cnnflow} (--cnnflow PATH, or --export-only)")
    torch.set_num_threads(a.threads)
    import onnxruntime
    import torchvision
    lines = [machine(), "",
             f"cnnflow import of PyTorch {torch.__version__}'s ONNX (TorchScript exporter, opset 17) / "
             f"torchvision {torchvision.__version__} / onnxruntime {onnxruntime.__version__}; batch {a.batch}, "
             f"{SHAPE[1]}x{SHAPE[2]}; reference PyTorch float64 on the same weights; tolerance {TOL:g} "
             f"(norm-relative)", "",
             "| model | ONNX nodes | layers imported | import s | eval logits | train logits | "
             "worst grad (tensor) | grads within 1e-4 (PyTorch f32's) | grads matched | weights in the library model | onnxruntime on the export | "
             "round-trip ONNX | "
             "PyTorch f32's own worst | cnnflow f64 vs PyTorch f64 | pass |",
             "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    print("\n".join(lines), flush=True)
    failed = []
    tmp = a.keep or tempfile.mkdtemp(prefix="onnx_import_")
    os.makedirs(tmp, exist_ok=True)
    try:
        for name in a.models.split(","):
            try:
                r = check(name, a, tmp)
            except Exception as e:  # one model's failure is a row, not the end of the table
                print(f"{name}: {e}", file=sys.stderr, flush=True)
                last = str(e).strip().splitlines()[-1][:160].replace("|", "/")
                line = f"| {name} | | | | error: {last} | | | | | | | | | | FAIL |"
                failed.append(name)
            else:
                if a.export_only:
                    line = (f"| {name} | {r['nodes']} | | | | | | | {r['params']} parameters | | {r['ort']:.1e} | | "
                            f"{r['torch32']:.1e} | | export only |")
                else:
                    ok, why = verdict(r)
                    if not ok:
                        failed.append(name)
                        print(f"{name}: {'; '.join(why)}", file=sys.stderr, flush=True)
                    rt = "n/a" if r["roundtrip"] is None else f"{r['roundtrip']:.1e}"
                    layers = "?" if r["layers"] is None else r["layers"]
                    f64 = "n/a" if r["f64"] is None else f"{r['f64']:.1e}"
                    lib = "-" if r["library"] is None else f"{r['library']:.1e}"
                    line = (f"| {name} | {r['nodes']} | {layers} | {r['import_s']:.2f} | {r['eval']:.1e} | "
                            f"{r['train']:.1e} | {r['grad']:.1e} ({r['worst']}) | {r['within']} ({r['torch_within']}) | {r['matched']}/{r['params']} | "
                            f"{lib} | {r['ort']:.1e} | {rt} | {r['torch32']:.1e} | {f64} | {'yes' if ok else 'FAIL'} |")
            lines.append(line)
            print(line, flush=True)
        if a.dynamo and not a.export_only:
            head = ["", "The newer exporter (dynamo=True, onnxscript; its optimiser folds BatchNormalization "
                    "into the convs, so only evaluation is compared):", "",
                    "| model | ONNX nodes | layers imported | import s | eval logits | onnxruntime on the export | "
                    "round-trip ONNX | pass |", "|---|---:|---:|---:|---:|---:|---:|---|"]
            lines += head
            print("\n".join(head), flush=True)
            for name in a.models.split(","):
                try:
                    r = check_dynamo(name, a, tmp)
                except Exception as e:
                    print(f"{name} (dynamo): {e}", file=sys.stderr, flush=True)
                    last = str(e).strip().splitlines()[-1][:160].replace("|", "/")
                    line = f"| {name} | | | | error: {last} | | | FAIL |"
                    failed.append(name + " (dynamo)")
                else:
                    ok = r["eval"] <= TOL and r["roundtrip"] <= TOL
                    if not ok:
                        failed.append(name + " (dynamo)")
                    line = (f"| {name} | {r['nodes']} | {r['layers']} | {r['import_s']:.2f} | {r['eval']:.1e} | "
                            f"{r['ort']:.1e} | {r['roundtrip']:.1e} | {'yes' if ok else 'FAIL'} |")
                lines.append(line)
                print(line, flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
