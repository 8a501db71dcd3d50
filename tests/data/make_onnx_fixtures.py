#!/usr/bin/env python3
"""Writes tests/data/onnx/: tiny networks as PyTorch's TorchScript exporter
writes them to ONNX, with PyTorch's answers on them, for the tests of
`cnnflow import` (which CI runs without PyTorch), and a copy of each .onnx as
a seed of fuzz/corpus/onnx_import/.

For each fixture NAME:
  - onnx/NAME.onnx: the network exported as bench/onnx_import_vs_pytorch.py
    exports torchvision's (export_onnx there: the TorchScript exporter,
    opset 17, eval mode, batch norm kept as BatchNormalization with its
    running statistics, no constant folding, so the initializers keep the
    state_dict's names; input "input", output "logits", dynamic batch);
  - onnx/NAME.check.safetensors: "input" [2, 3, 16, 16] f32, "labels" [2]
    (f32 class indices: cnnflow's safetensors reader takes no I64), and the
    exact answers for those f32 weights and input, computed by PyTorch in
    float64 and stored in F64: "logits" (evaluation mode), "logits_train"
    (training mode: batch norm on the batch's statistics), "loss" [1] (the
    mean cross-entropy on "labels" in training mode) and "grad.<name>" for
    every parameter (its gradient, by its state_dict name).
The weights are random with non-trivial batch norm statistics and affine
maps (randomise of bench/library_vs_pytorch.py); these nets have no dropout.

  resnet_block               conv3x3+BN+ReLU stem, one torchvision BasicBlock
                             of stride 2 with a 1x1 conv+BN downsample,
                             avgpool, flatten, fc (torchvision's names)
  inverted_residual_se_silu  conv+BN+SiLU stem, one torchvision MBConv
                             (expansion, depthwise, SqueezeExcitation with
                             SiLU, projection, residual add; BN eps 1e-3),
                             a conv+BN+ReLU6 head (Clip), pool, Linear
  zoo_net                    the other mappings (ZooNet's docstring says which)
  gelu_net                   conv+BN+GELU (erf), conv+GELU (tanh), max pool,
                             flatten of an 8x8 map, Linear; the two zero conv
                             biases export as one initializer and an Identity

resnet_block_folded is resnet_block's network and weights exported with
batch norm folded into the convolutions (training=EVAL, constant folding
on), as a user's export often is: its initializers are named by the
exporter (onnx::Conv_NN), not by PyTorch, so its check file holds only
"input" and "logits". inverted_residual_se_silu_dynamo is that network
from the newer exporter (dynamo=True, onnxscript; its optimiser folds BN
too), its module scopes in the nodes' metadata; input and logits as well.

Run in the venv of bench/torch_venv.sh (torch, torchvision, onnx, safetensors):
  $(bench/torch_venv.sh) tests/data/make_onnx_fixtures.py [--describe]
--describe also prints each graph's op types, initializers and the GELU
node sequences (what the importer's pattern matcher sees).
"""
import argparse
import collections
import copy
import os
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from library_vs_pytorch import randomise  # noqa: E402
from onnx_import_vs_pytorch import export_onnx, export_onnx_dynamo  # noqa: E402

SHAPE = (3, 16, 16)
BATCH = 2
CLASSES = 5


# ---------------------------------------------------------------- the networks

class ResNetBlock(nn.Module):
    """A conv3x3+BN+ReLU stem and one torchvision BasicBlock of stride 2 with
    its 1x1 conv+BN downsample, by torchvision's ResNet names."""

    def __init__(self, width=8, classes=CLASSES):
        from torchvision.models.resnet import BasicBlock
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        down = nn.Sequential(nn.Conv2d(width, 2 * width, 1, 2, bias=False), nn.BatchNorm2d(2 * width))
        self.layer1 = nn.Sequential(BasicBlock(width, 2 * width, 2, down))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = self.layer1(self.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class InvertedResidualSE(nn.Module):
    """EfficientNet's pieces by torchvision's names: a conv+BN+SiLU stem
    (features.0), one MBConv (features.1: 1x1 expansion+BN+SiLU, depthwise
    3x3+BN+SiLU, torchvision.ops.SqueezeExcitation with SiLU, 1x1
    projection+BN, the residual add), a MobileNet-style conv+BN+ReLU6 head
    (features.2; ReLU6 exports as Clip), the pool and a Linear."""

    def __init__(self, width=8, expand=4, head=16, classes=CLASSES):
        from functools import partial
        from torchvision.models.efficientnet import MBConv, MBConvConfig
        from torchvision.ops.misc import Conv2dNormActivation
        super().__init__()
        cnf = MBConvConfig(expand, 3, 1, width, width, 1, 1.0, 1.0)
        self.features = nn.Sequential(
            Conv2dNormActivation(3, width, 3, norm_layer=nn.BatchNorm2d, activation_layer=nn.SiLU),
            MBConv(cnf, 0.0, partial(nn.BatchNorm2d, eps=1e-3)),
            Conv2dNormActivation(width, head, 1, norm_layer=nn.BatchNorm2d, activation_layer=nn.ReLU6))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(head, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class GeluNet(nn.Module):
    """conv+BN+GELU (erf), conv+GELU (tanh approximation), a 2x2 max pool and
    a Linear on the flattened 8x8 map (not a global pool: Flatten's order).
    The two conv biases are zero, as torchvision's EfficientNet and
    MobileNet initialise theirs: the exporter keeps one of two equal
    initializers and aliases the other, `Identity(conv1.bias) -> conv2.bias`
    (efficientnet_b0 exports 18 such Identity nodes, its SE biases); the two
    stay two parameters with their own gradients."""

    def __init__(self, width=8, classes=CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1)
        self.bn1 = nn.BatchNorm2d(width)
        self.gelu1 = nn.GELU()
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1)
        self.gelu2 = nn.GELU(approximate="tanh")
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(width * (SHAPE[1] // 2) * (SHAPE[2] // 2), classes)
        nn.init.zeros_(self.conv1.bias)
        nn.init.zeros_(self.conv2.bias)

    def forward(self, x):
        x = self.gelu1(self.bn1(self.conv1(x)))
        x = self.pool(self.gelu2(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))


class ZooNet(nn.Module):
    """The importer's other mappings on one small network: LeakyReLU,
    ConvTranspose2d, Hardswish, AvgPool2d (padded, count_include_pad=False),
    nearest Upsample (Resize), a branch joined by torch.cat (Concat) through
    a Hardsigmoid, a per-channel scale (Mul by a [C, 1, 1] parameter: a
    layer_scale), a division by a constant, the mean over H and W
    (ReduceMean: global_avgpool), a bias-free Linear, and a final softmax
    (left out on import: the check holds the logits before it)."""

    def __init__(self, width=8, classes=CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 2, 1)
        self.act1 = nn.LeakyReLU(0.2)
        self.up = nn.ConvTranspose2d(width, width, 4, 2, 1)
        self.act2 = nn.Hardswish()
        self.pool = nn.AvgPool2d(3, 2, 1, count_include_pad=False)
        self.resize = nn.Upsample(scale_factor=2, mode="nearest")
        self.branch = nn.Conv2d(3, width, 3, 1, 1)
        self.gate = nn.Hardsigmoid()
        self.layer_scale = nn.Parameter(torch.linspace(0.5, 1.5, 2 * width).reshape(2 * width, 1, 1))
        self.fc = nn.Linear(2 * width, classes, bias=False)
        self.softmax = False  # True for the export only

    def forward(self, x):
        a = self.resize(self.pool(self.act2(self.up(self.act1(self.conv1(x))))))
        b = self.gate(self.branch(x))
        y = (self.layer_scale * torch.cat([a, b], 1) / 3.0).mean((2, 3))
        y = self.fc(y)
        return torch.softmax(y, 1) if self.softmax else y


class ShuffleNet(nn.Module):
    """ShuffleNet V2's channel shuffle as torchvision writes it
    (torchvision.models.shufflenetv2.channel_shuffle: view, transpose,
    view) between two 1x1 conv+BN+ReLU, the pool and a Linear."""

    def __init__(self, width=8, classes=CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        from torchvision.models.shufflenetv2 import channel_shuffle
        x = channel_shuffle(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class ShuffleUnit(nn.Module):
    """ShuffleNet V2's unit as torchvision writes it (x.chunk(2, dim=1), one
    half through 1x1 conv+BN+ReLU, torch.cat, channel_shuffle), then
    torch.split into unequal parts joined the other way round: Slice (with
    ends computed from x.size()), Split, the shape arithmetic, Concat."""

    def __init__(self, width=8, classes=CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width // 2, width // 2, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width // 2)
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        from torchvision.models.shufflenetv2 import channel_shuffle
        x = torch.relu(self.bn1(self.conv1(x)))
        x1, x2 = x.chunk(2, dim=1)
        x = channel_shuffle(torch.cat([x1, torch.relu(self.bn2(self.conv2(x2)))], 1), 2)
        a, b = torch.split(x, [3, x.size(1) - 3], dim=1)
        x = torch.cat([b, a], 1)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class CeilPoolNet(nn.Module):
    """Poolings whose ceil_mode rounds the output size up (GoogLeNet's max
    pools): MaxPool2d(3, 2, ceil_mode), AvgPool2d(3, 2, 1, ceil_mode)
    counting the padding, and AvgPool2d(2, 2, ceil_mode) not counting it."""

    def __init__(self, width=8, classes=CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)                    # 16 -> 8 (floor: 7)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1)
        self.pool2 = nn.AvgPool2d(3, 2, 1, ceil_mode=True)                 # 8 -> 5 (floor: 4)
        self.pool3 = nn.AvgPool2d(2, 2, ceil_mode=True, count_include_pad=False)  # 5 -> 3
        self.fc = nn.Linear(width * 9, classes)

    def forward(self, x):
        x = self.pool1(torch.relu(self.conv1(x)))
        x = self.pool3(self.pool2(torch.relu(self.conv2(x))))
        return self.fc(torch.flatten(x, 1))


def convnext_net():
    """torchvision's ConvNeXt at two small stages: its blocks permute to
    channels-last for LayerNorm, Linear, GELU, Linear and permute back
    (Transpose -> LayerNormalization -> MatMul + Add ... -> Transpose), a
    [C, 1, 1] layer scale after; LayerNorm2d permutes around its norm."""
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    return ConvNeXt([CNBlockConfig(8, 16, 1), CNBlockConfig(16, None, 1)],
                    stochastic_depth_prob=0.0, num_classes=CLASSES)


# name: (the network, the other exports of it: "folded" (TorchScript, BN
# folded), "dynamo" (the newer exporter, whose optimiser folds BN too),
# "dynamic" (a dynamic batch, where the main export's is fixed))
NETS = {
    "resnet_block": (ResNetBlock, ("folded",)),
    "inverted_residual_se_silu": (InvertedResidualSE, ("dynamo",)),
    "gelu_net": (GeluNet, ()),
    "zoo_net": (ZooNet, ()),
    "shuffle_net": (ShuffleNet, ("dynamic",)),
    "shuffle_unit": (ShuffleUnit, ()),
    "ceil_pool_net": (CeilPoolNet, ()),
    "convnext_net": (convnext_net, ()),
}
# Exported with the batch fixed (the channel shuffle's view sizes are then
# constants; with a dynamic batch they are computed from Shape nodes, which
# the importer does not map yet).
FIXED_BATCH = {"shuffle_net"}


def export_fixed(model, x, path):
    """export_onnx's settings with the batch size fixed (no dynamic_axes)."""
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, x, path, dynamo=False, training=torch.onnx.TrainingMode.PRESERVE,
                          do_constant_folding=False, input_names=["input"],
                          output_names=["logits"], opset_version=17)


def export_dynamo(model, x, path):
    """export_onnx_dynamo, without the nodes' stack traces and FX text (local
    paths, most of the file); the module scopes the importer names layers
    by stay."""
    import onnx
    export_onnx_dynamo(model, x, path)
    m = onnx.load(path)
    for n in m.graph.node:
        keep = [(p.key, p.value) for p in n.metadata_props if p.key == "pkg.torch.onnx.name_scopes"]
        del n.metadata_props[:]
        for k, v in keep:
            n.metadata_props.add(key=k, value=v)
    m.producer_version = torch.__version__.split("+")[0]
    onnx.save(m, path)


def reference(model, x, labels):
    """PyTorch in float64 on the model's (f32) values: eval logits, train
    logits, the loss and every parameter's gradient (the exact answers)."""
    m = copy.deepcopy(model).double()
    xd = x.double()
    m.eval()
    with torch.no_grad():
        ev = m(xd)
    m.train()
    m.zero_grad()
    lo = m(xd)
    loss = F.cross_entropy(lo, labels)
    loss.backward()
    out = {"logits": ev, "logits_train": lo.detach(), "loss": loss.detach().reshape(1)}
    out.update({"grad." + n: p.grad for n, p in m.named_parameters()})
    return out


def describe(path):
    import onnx
    from onnx import numpy_helper
    g = onnx.load(path).graph
    ops = collections.Counter(n.op_type for n in g.node)
    print(f"  ops: {dict(sorted(ops.items()))}")
    print(f"  initializers ({len(g.initializer)}): {[i.name for i in g.initializer][:8]}")
    for n in g.node:
        if n.op_type == "Identity":
            print(f"  {n.name}: Identity({n.input[0]}) -> {n.output[0]}")
    # The GELUs: from each Erf or Tanh, the nodes of its module's scope
    # (the exporter names them /<module path>/<Op>).
    for n in g.node:
        if n.op_type in ("Erf", "Tanh"):
            scope = n.name.rsplit("/", 1)[0] + "/"
            seq = []
            for m in g.node:
                if m.name.startswith(scope):
                    if m.op_type == "Constant":
                        seq.append(f"Constant({numpy_helper.to_array(m.attribute[0].t).tolist()!r})")
                    else:
                        seq.append(f"{m.op_type}({', '.join(m.input)})")
            print(f"  {n.op_type} GELU {scope}: " + " -> ".join(seq))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--describe", action="store_true")
    a = ap.parse_args()
    from safetensors.torch import save_file
    out_dir = os.path.join(HERE, "onnx")
    corpus = os.path.join(ROOT, "fuzz", "corpus", "onnx_import")
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(corpus, exist_ok=True)
    written = []
    for name, (make, others) in NETS.items():
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(1)
        model = make().float()
        randomise(model, gen)
        x = torch.randn((BATCH,) + SHAPE, generator=gen)
        labels = torch.randint(0, CLASSES, (BATCH,), generator=gen)
        variants = [(name, "")] + [(f"{name}_{kind}", kind) for kind in others]
        for fname, kind in variants:  # exported before any training-mode forward moves the BN statistics
            path = os.path.join(out_dir, f"{fname}.onnx")
            exported = copy.deepcopy(model)
            if hasattr(exported, "softmax"):
                exported.softmax = True
            if kind == "dynamo":
                export_dynamo(exported, x, path)
            elif kind == "" and name in FIXED_BATCH:
                export_fixed(exported, x, path)
            else:
                export_onnx(exported, x, path, folded=kind == "folded")
        ref = reference(model, x, labels)
        checks = {name: {"input": x, "labels": labels.float(), **{k: v.double() for k, v in ref.items()}}}
        for fname, kind in variants[1:]:
            checks[fname] = {"input": x, "logits": ref["logits"].double()}
        for fname, _ in variants:
            onnx_path = os.path.join(out_dir, f"{fname}.onnx")
            with open(onnx_path, "rb") as f:
                data = f.read()
            with open(os.path.join(corpus, f"{fname}.onnx"), "wb") as f:
                f.write(data)
            check = os.path.join(out_dir, f"{fname}.check.safetensors")
            save_file({k: v.contiguous() for k, v in checks[fname].items()}, check,
                      metadata={"torch": torch.__version__})  # one key: safetensors orders several at random
            written += [onnx_path, check]
    total = 0
    for p in written:
        size = os.path.getsize(p)
        total += size
        print(f"{os.path.relpath(p, ROOT)}: {size} bytes")
        if a.describe and p.endswith(".onnx"):
            describe(p)
    print(f"total {total} bytes (the fuzz seeds fuzz/corpus/onnx_import/*.onnx are copies of the .onnx files)")


if __name__ == "__main__":
    main()
