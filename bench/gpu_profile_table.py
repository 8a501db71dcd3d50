#!/usr/bin/env python3
"""Where a GPU training step goes, cnnflow beside PyTorch: one table of ms per
step by kernel class (convolution forward, backward-data, backward-weights,
batch norm, matmul, pooling, elementwise, loss, optimizer, copies, layout
conversions, other) and the GPU's idle time between kernels.

    build/cnnflow train CONFIG --trace cnnflow.json --trace-steps 20
    python3 bench/pytorch_train.py --device cuda ... --profile torch.json --profile-steps 20
    python3 bench/gpu_profile_table.py --cnnflow cnnflow.json --torch torch.json

Either side alone prints its column. cnnflow's side is its GPU lanes
("cuda:K"): spans of the categories "gpu forward" and "gpu backward" per
layer ("<layer> (<type>)"), "gpu backward-data" and "gpu backward-weights"
inside a convolution's backward, "gpu optimizer" (a relu fused into a
batchnorm or an add counts in that layer's class). PyTorch's is the kernels
and copies of torch.profiler's Chrome trace, classified by kernel name.
Steps: --steps, else cnnflow's replica-0 "step" spans and PyTorch's
ProfilerStep# annotations. Idle: the span from the first kernel to the last
less the time some kernel runs (per GPU, summed).
"""
import argparse
import collections
import json
import re
import sys

CLASSES = ["conv forward", "conv backward-data", "conv backward-weights",
           "conv backward (other)", "batch norm", "matmul", "pooling", "elementwise",
           "loss", "optimizer", "copy", "layout", "other", "idle"]

# PyTorch kernel names, first match wins (convolutions before matmuls:
# cuDNN's implicit-GEMM kernels have "gemm" in their names).
TORCH_PATTERNS = [
    ("conv backward-data", r"dgrad|bprop_data|backward_data|convolveNd_dgrad"),
    ("conv backward-weights", r"wgrad|bprop_filter|backward_filter|convolveNd_wgrad"),
    ("conv forward", r"fprop|implicit_convolve|conv2d|convolve_|winograd|conv_fwd"),
    ("batch norm", r"bn_|batch_norm|batchnorm|welford"),
    ("optimizer", r"multi_tensor_apply|foreach|fused_sgd|fused_adam"),
    ("layout", r"nchwToNhwc|nhwcToNchw|nchw_to_nhwc|nhwc_to_nchw|transpose|permute"),
    ("pooling", r"pool"),
    ("loss", r"nll_loss|log_softmax|softmax|cross_entropy"),
    ("matmul", r"gemm|matmul|cublas|cutlass"),
    ("elementwise", r"elementwise|vectorized|unrolled|relu|threshold|add|mul|fill|copy|reduce"),
]

# cnnflow layer types by class (the rest of a forward or backward span).
CNNFLOW_TYPES = {
    "batch norm": {"batchnorm", "batchnorm1d", "groupnorm", "layernorm"},
    "matmul": {"linear"},
    "pooling": {"maxpool2d", "avgpool2d", "global_avgpool", "adaptive_avgpool2d",
                "maxpool1d", "avgpool1d"},
}
CONV_TYPES = {"conv2d", "conv1d", "conv_transpose2d"}


def merged_length(intervals):
    """Time covered by the union of [begin, end) intervals."""
    total, end = 0.0, None
    start = None
    for b, e in sorted(intervals):
        if end is None or b > end:
            if end is not None:
                total += end - start
            start, end = b, e
        else:
            end = max(end, e)
    if end is not None:
        total += end - start
    return total


def idle(lanes):
    """Per lane: first begin to last end, less the covered time; summed."""
    return sum((max(e for _, e in iv) - min(b for b, _ in iv)) - merged_length(iv)
               for iv in lanes.values() if iv)


def cnnflow_table(events):
    """ms by class over the whole trace, and the step count."""
    lanes = {e["tid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    gpu = [e for e in events if e.get("ph") == "X" and lanes.get(e.get("tid"), "").startswith("cuda:")]
    steps = sum(1 for e in events if e.get("ph") == "X" and e.get("cat") == "step"
                and e.get("name") == "replica 0")
    us = collections.Counter()
    # A convolution's backward less its backward-data and backward-weights
    # spans (nested in it on the same lane).
    inner = [e for e in gpu if e["cat"] in ("gpu backward-data", "gpu backward-weights")]
    for e in gpu:
        cat, name = e["cat"], e.get("name", "")
        m = re.match(r".* \((\w+)\)", name)
        kind = m.group(1) if m else ""
        if cat == "gpu optimizer":
            us["optimizer"] += e["dur"]
        elif cat == "gpu backward-data":
            us["conv backward-data"] += e["dur"]
        elif cat == "gpu backward-weights":
            us["conv backward-weights"] += e["dur"]
        elif cat in ("gpu forward", "gpu backward") and kind in CONV_TYPES:
            if cat == "gpu forward":
                us["conv forward"] += e["dur"]
            else:
                nested = sum(i["dur"] for i in inner if i["tid"] == e["tid"]
                             and e["ts"] <= i["ts"] and i["ts"] + i["dur"] <= e["ts"] + e["dur"])
                us["conv backward (other)"] += e["dur"] - nested
        elif cat in ("gpu forward", "gpu backward"):
            cls = next((c for c, types in CNNFLOW_TYPES.items() if kind in types), "elementwise")
            us[cls] += e["dur"]
        elif cat == "gpu copy":
            us["copy"] += e["dur"]
        else:
            us["other"] += e["dur"]
    tops = collections.defaultdict(list)
    for e in gpu:
        if e["cat"] not in ("gpu backward-data", "gpu backward-weights"):
            tops[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    us["idle"] = idle(tops)
    return {k: v / 1e3 for k, v in us.items()}, steps


def torch_class(e):
    if e.get("cat") in ("gpu_memcpy", "gpu_memset"):
        return "copy"
    name = e.get("name", "")
    return next((c for c, p in TORCH_PATTERNS if re.search(p, name, re.I)), "other")


def torch_table(events):
    kernels = [e for e in events if e.get("ph") == "X"
               and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    steps = sum(1 for e in events if e.get("ph") == "X"
                and str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") == "user_annotation")
    us = collections.Counter()
    lanes = collections.defaultdict(list)
    for e in kernels:
        us[torch_class(e)] += e["dur"]
        lanes[(e.get("pid"), e.get("tid"))].append((e["ts"], e["ts"] + e["dur"]))
    us["idle"] = idle(lanes)
    return {k: v / 1e3 for k, v in us.items()}, steps


def load(path):
    with open(path) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cnnflow", help="cnnflow train --trace FILE")
    p.add_argument("--torch", help="torch.profiler Chrome trace (pytorch_train.py --profile)")
    p.add_argument("--steps", type=int, default=0,
                   help="steps in each trace (default: counted from the traces)")
    args = p.parse_args(argv)
    if not args.cnnflow and not args.torch:
        p.error("give --cnnflow, --torch or both")
    columns = []
    for label, path, reduce in (("cnnflow", args.cnnflow, cnnflow_table),
                                ("PyTorch", args.torch, torch_table)):
        if not path:
            continue
        table, steps = reduce(load(path))
        steps = args.steps or steps
        if steps <= 0:
            sys.exit(f"{path}: no steps found in the trace; give --steps")
        columns.append((label, {k: v / steps for k, v in table.items()}, steps))
    header = "| class | " + " | ".join(f"{c[0]} ms/step ({c[2]} steps)" for c in columns)
    if len(columns) == 2:
        header += " | cnnflow / PyTorch"
    print(header + " |")
    print("|---" * (len(columns) + 1 + (len(columns) == 2)) + "|")
    totals = [0.0] * len(columns)
    for cls in CLASSES:
        values = [c[1].get(cls, 0.0) for c in columns]
        if not any(values):
            continue
        totals = [t + v for t, v in zip(totals, values)]
        row = f"| {cls} | " + " | ".join(f"{v:.2f}" for v in values)
        if len(columns) == 2:
            row += f" | {values[0] / values[1]:.2f}x" if values[1] > 0 else " | -"
        print(row + " |")
    row = "| step (kernels + idle) | " + " | ".join(f"{t:.2f}" for t in totals)
    if len(columns) == 2:
        row += f" | {totals[0] / totals[1]:.2f}x" if totals[1] > 0 else " | -"
    print(row + " |")


if __name__ == "__main__":
    main()
