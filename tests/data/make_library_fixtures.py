#!/usr/bin/env python3
"""Writes tests/data/library/*.safetensors: small networks of the model
library as PyTorch defines them, with PyTorch's weights, an input and its
logits, for tests/pipeline/library_fixtures_test.cc (which CI runs without
PyTorch).

Each file holds the network's state_dict (f16, so the files stay small: the
logits are computed from the f16-rounded weights and input, in float64, so
they are exact for them), "input" and the "logits" of evaluation mode and
"logits_train" of training mode (batch statistics), and metadata "model"
(the library name) and "with" (its options and input shape, "k=v;k=v"). The weights are
random with non-trivial BN statistics and layer scales, as
bench/library_vs_pytorch.py makes them.

Run in the venv of bench/torch_venv.sh (torch, torchvision, safetensors):
  $(bench/torch_venv.sh) tests/data/make_library_fixtures.py
"""
import os
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
from library_vs_pytorch import InceptionTime, randomise  # noqa: E402


class TinyResNet(nn.Module):
    """torchvision's ResNet (its Bottleneck, its names) at a base width other
    than 64, which torchvision's class does not take."""

    def __init__(self, depths, width, groups, width_per_group, classes):
        from torchvision.models.resnet import Bottleneck
        super().__init__()
        self.inplanes, self.groups, self.base_width = width, groups, width_per_group
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        for i, n in enumerate(depths):
            setattr(self, f"layer{i + 1}", self._make_layer(Bottleneck, width * 2 ** i, n, 1 if i == 0 else 2))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width * 8 * Bottleneck.expansion, classes)

    def _make_layer(self, block, planes, blocks, stride):
        down = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            down = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                                 nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, down, self.groups, self.base_width)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes, groups=self.groups, base_width=self.base_width)
                   for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def mobilenet_v2():
    import torchvision
    return torchvision.models.mobilenet_v2(num_classes=10, width_mult=0.1)


def efficientnet():
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
    setting, last = _efficientnet_conf("efficientnet_b0", width_mult=0.1, depth_mult=0.34)
    return EfficientNet(setting, 0.0, stochastic_depth_prob=0.0, num_classes=10, last_channel=last)


def convnext():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    cfg = [CNBlockConfig(8, 16, 1), CNBlockConfig(16, 24, 1), CNBlockConfig(24, 32, 2), CNBlockConfig(32, None, 1)]
    return ConvNeXt(cfg, stochastic_depth_prob=0.0, num_classes=10)


# file: (library model, its options, the PyTorch network, input sample shape)
FIXTURES = {
    "resnet_bottleneck": ("resnet50", "classes=10;width=8;depths=[1, 2, 1, 1];groups=2;width_per_group=16",
                          lambda: TinyResNet([1, 2, 1, 1], 8, 2, 16, 10), (3, 32, 32)),
    "mobilenet_v2": ("mobilenet_v2", "classes=10;width_mult=0.1;dropout=0", mobilenet_v2, (3, 64, 64)),
    "efficientnet": ("efficientnet_b0", "classes=10;width_mult=0.1;depth_mult=0.34;dropout=0;stochastic_depth=0",
                     efficientnet, (3, 64, 64)),
    "convnext": ("convnext_tiny", "classes=10;depths=[1, 1, 2, 1];dims=[8, 16, 24, 32];stochastic_depth=0",
                 convnext, (3, 32, 32)),
    "inception_time": ("inception_time", "classes=5;in_channels=3;length=32;nf=4",
                       lambda: InceptionTime(3, 5, nf=4), (3, 32)),
}


def main():
    from safetensors.torch import save_file
    out_dir = os.path.join(HERE, "library")
    os.makedirs(out_dir, exist_ok=True)
    for name, (model_name, options, make, shape) in FIXTURES.items():
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(1)
        model = make().float()
        randomise(model, gen)
        with torch.no_grad():  # the weights as the file holds them (f16), so the logits are theirs
            for t in list(model.parameters()) + list(model.buffers()):
                if t.is_floating_point():
                    t.copy_(t.half().float())
        x = torch.randn((4,) + shape, generator=gen).half().float()
        tensors = {k: v.detach().half().contiguous() for k, v in model.state_dict().items()
                   if not k.endswith("num_batches_tracked")}  # before a training forward moves the BN statistics
        # The logits in float64 (rounded to f32 once): the exact answer for
        # these values, not PyTorch's own f32 rounding (which is off it by
        # up to ~3e-4 in training mode for these small nets).
        model = model.double()
        model.eval()
        with torch.no_grad():
            logits = model(x.double()).float()
        model.train()
        with torch.no_grad():
            logits_train = model(x.double()).float()
        tensors["input"] = x.half()
        tensors["logits"] = logits.contiguous()
        tensors["logits_train"] = logits_train.contiguous()
        path = os.path.join(out_dir, f"{name}.safetensors")
        save_file(tensors, path, metadata={"model": model_name, "with": f"{options};input={list(shape)}",
                                            "torch": torch.__version__})
        print(f"{path}: {os.path.getsize(path)} bytes, {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    main()
