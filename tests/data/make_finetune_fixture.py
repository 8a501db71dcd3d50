#!/usr/bin/env python3
"""Writes tests/data/pth/resnet_tiny_pretrained.pth: "pretrained" weights of a
small torchvision-style ResNet (the Bottleneck network of
tests/data/make_library_fixtures.py, as the library's resnet50 with
classes=10;width=8;depths=[1, 2, 1, 1];groups=2;width_per_group=16 builds
it), saved by torch.save as a DDP checkpoint ({"state_dict": ...} with the
"module." prefix, f16), the way downloaded weights come. For
tests/pipeline/freeze_test.cc, which fine-tunes it with train.freeze on a
4-class head (CI runs it without PyTorch).

Run in the venv of bench/torch_venv.sh:
  $(bench/torch_venv.sh) tests/data/make_finetune_fixture.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
from library_vs_pytorch import randomise  # noqa: E402
from make_library_fixtures import TinyResNet  # noqa: E402


def main():
    torch.manual_seed(0)
    model = TinyResNet([1, 2, 1, 1], 8, 2, 16, 10)
    randomise(model, torch.Generator().manual_seed(7))
    state = {f"module.{k}": v.detach().half() if v.is_floating_point() else v
             for k, v in model.state_dict().items()}
    path = os.path.join(HERE, "pth", "resnet_tiny_pretrained.pth")
    torch.save({"state_dict": state, "epoch": 90}, path)
    back = torch.load(path, weights_only=True)["state_dict"]
    assert all(torch.equal(back[k], v) for k, v in state.items())
    print(f"{path}: {os.path.getsize(path)} bytes, {len(state)} tensors")


if __name__ == "__main__":
    main()
