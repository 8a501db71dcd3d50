"""Writes tests/data/pytorch_tiny.safetensors and .json: the model of
tests/data/pytorch_tiny.yaml trained by PyTorch for 300 steps on
Fashion-MNIST, saved as a DataParallel state_dict ("module." names, BN's
num_batches_tracked included) by the safetensors package, and its test-set
accuracy and loss as PyTorch evaluates it. The train.init tests start
cnnflow from these weights and must evaluate as PyTorch did.

Not run in CI (no PyTorch there); rerun by hand:
    .venv-torch/bin/pip install safetensors
    .venv-torch/bin/python tests/data/make_pytorch_tiny.py
"""
import gzip
import json
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = "/usr/share/datasets/fashion-mnist"


def idx(name, offset):
    with gzip.open(os.path.join(DATA, name)) as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def images(name):
    x = idx(name, 16).reshape(-1, 1, 28, 28).astype(np.float32) / 255.0
    return torch.from_numpy((x - np.float32(0.2860)) / np.float32(0.3530))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 14 * 14, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        return self.fc(torch.flatten(x, 1))


def main():
    torch.manual_seed(0)
    xtr, ytr = images("train-images-idx3-ubyte.gz"), torch.from_numpy(idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    xte, yte = images("t10k-images-idx3-ubyte.gz"), torch.from_numpy(idx("t10k-labels-idx1-ubyte.gz", 8).astype(np.int64))
    net = nn.DataParallel(Tiny())  # as a DDP / DataParallel user saves it: "module." names
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    perm = torch.randperm(len(xtr))
    net.train()
    for step in range(300):
        i = perm[step * 64:(step + 1) * 64]
        opt.zero_grad()
        F.cross_entropy(net(xtr[i]), ytr[i]).backward()
        opt.step()
    net.eval()
    with torch.no_grad():
        logits = net(xte)
        loss = F.cross_entropy(logits, yte, reduction="sum").item() / len(yte)
        correct = int((logits.argmax(1) == yte).sum())
    state = {k: v.contiguous() for k, v in net.state_dict().items()}
    save_file(state, os.path.join(HERE, "pytorch_tiny.safetensors"))
    with open(os.path.join(HERE, "pytorch_tiny.json"), "w") as f:
        json.dump({"torch": torch.__version__, "test_samples": len(yte), "test_correct": correct,
                   "test_loss": loss, "tensors": sorted(state)}, f, indent=1)
        f.write("\n")
    print(f"test accuracy {correct / len(yte):.4f}, loss {loss:.5f}; tensors {sorted(state)}")


if __name__ == "__main__":
    main()
