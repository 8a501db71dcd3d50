#!/usr/bin/env python3
"""cnnflow's TrivialAugmentWide and ColorJitter against torchvision's, on the
same images with the same parameters (not part of CI: torch is never there).

    PY=$(bash bench/torch_venv.sh)   # or any python with torchvision
    ninja -C build-wip augment_dump
    $PY bench/augment_vs_torchvision.py --dump build-wip/bench/augment_dump \\
        --images data/cifar10-jpeg/train --count 6

What it runs, through bench/augment_dump (the augmenter's RunWithParams on
the whole image, no normalisation):
  - the magnitude tables against TrivialAugmentWide()._augmentation_space(31);
  - every TrivialAugmentWide op at every magnitude bin and both signs on each
    image, against torchvision.transforms.autoaugment._apply_op on the uint8
    tensor (NEAREST, fill None): pixels that differ, and by how much;
  - ColorJitter with random options, factors and orders, against
    torchvision's ColorJitter module (its get_params replaced to return the
    same draw) on ToTensor's float image: the largest difference.
Images: one JPEG from each of the first --count folders under --images
(RGB; larger than --max-side shrunk to it, or all resized to --resize
rows), and the first one's grayscale
("L") for the 1-channel path, and an odd, non-square crop of the first.
"""
import argparse
import os
import random
import subprocess
import tempfile

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import ColorJitter, InterpolationMode, TrivialAugmentWide
from torchvision.transforms import autoaugment
from torchvision.transforms import functional as F


def load_images(root, count, max_side, resize):
    paths = []
    for d, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            if f.lower().endswith((".jpg", ".jpeg", ".png")):
                paths.append(os.path.join(d, f))
                break  # one per folder: a spread of classes
        if len(paths) >= count:
            break
    def load(p, mode):
        im = Image.open(p).convert(mode)
        if resize:
            im = im.resize((resize * 5 // 4, resize), Image.BILINEAR)
        elif max(im.size) > max_side:
            im.thumbnail((max_side, max_side))
        return np.asarray(im)
    imgs = [load(p, "RGB") for p in paths]
    gray = load(paths[0], "L")[:, :, None]
    # An odd, non-square one too (the affine grid's centre at half pixels).
    odd = np.ascontiguousarray(imgs[0][: imgs[0].shape[0] * 7 // 8 | 1, : imgs[0].shape[1] - 1])
    return paths, imgs + [gray, odd]


def run_dump(dump, lines):
    subprocess.run([dump], input="\n".join(lines) + "\n", text=True, check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True, help="build/bench/augment_dump")
    ap.add_argument("--images", required=True, help="a folder of JPEGs")
    ap.add_argument("--count", type=int, default=6)
    ap.add_argument("--max-side", type=int, default=160, help="larger images are shrunk to this")
    ap.add_argument("--resize", type=int, default=0,
                    help="resize every image to this height (width 5/4 of it) first")
    ap.add_argument("--jitter-cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    paths, imgs = load_images(args.images, args.count, args.max_side, args.resize)
    print(f"images: {len(paths)} RGB from {args.images} ({imgs[0].shape[0]}x{imgs[0].shape[1]})"
          f" + the first as grayscale + a {imgs[-1].shape[0]}x{imgs[-1].shape[1]} crop of it")

    # 1. The magnitude tables.
    table = subprocess.run([args.dump, "table"], capture_output=True, text=True, check=True)
    ours = {}
    for row in table.stdout.split("\n"):
        if row:
            name, signed, *mags = row.split()
            ours[name] = (int(signed), np.array([float(m) for m in mags]))
    space = TrivialAugmentWide()._augmentation_space(31)
    assert list(space.keys()) == list(ours.keys()), (list(space.keys()), list(ours.keys()))
    print("\n== magnitude tables (ours vs TrivialAugmentWide()._augmentation_space(31))")
    for name, (mags, signed) in space.items():
        tv = mags.double().numpy() if mags.ndim > 0 else np.zeros(31)
        tv = np.broadcast_to(tv, (31,))
        diff = np.abs(tv - ours[name][1])
        note = ""
        if name.startswith("Translate"):
            # What _apply_op uses: int(magnitude).
            bad = [b for b in range(31) if int(tv[b]) != int(ours[name][1][b])]
            note = f"; int() differs at bins {bad}: torchvision {[tv[b] for b in bad]}"
        print(f"{name:13s} signed {bool(signed)!s:5s} (tv {signed!s:5s}) max |diff| "
              f"{diff.max():.3g}{note}")

    with tempfile.TemporaryDirectory() as tmp:
        raw = []
        for i, img in enumerate(imgs):
            p = os.path.join(tmp, f"img{i}.u8")
            img.tofile(p)
            raw.append(p)

        # 2. TrivialAugmentWide's ops.
        names = list(space.keys())
        cases, lines = [], []
        for i, img in enumerate(imgs):
            h, w, c = img.shape
            for op, name in enumerate(names):
                mags, signed = space[name]
                for b in range(31 if mags.ndim > 0 else 1):
                    for sign in ([1.0, -1.0] if signed else [1.0]):
                        m = sign * (float(mags[b]) if mags.ndim > 0 else 0.0)
                        out = os.path.join(tmp, f"t{len(cases)}.f32")
                        cases.append((i, name, m, out))
                        lines.append(f"{raw[i]} {h} {w} {c} {out} trivial {op} {m!r}")
        run_dump(args.dump, lines)
        stats = {}
        for i, name, m, out in cases:
            img = imgs[i]
            h, w, c = img.shape
            t = torch.from_numpy(img.copy()).permute(2, 0, 1).contiguous()
            ref = autoaugment._apply_op(t, name, m, InterpolationMode.NEAREST, None).numpy()
            got = np.fromfile(out, dtype=np.float32).reshape(c, h, w)
            got8 = np.rint(got * 255.0).astype(np.int32)
            d = np.abs(got8 - ref.astype(np.int32))
            s = stats.setdefault(name, [0, 0, 0, 0, []])
            s[0] += 1
            s[1] += int((d > 0).sum())
            s[2] = max(s[2], int(d.max()))
            s[3] += d.size
            if d.max() > 0 and len(s[4]) < 3:
                s[4].append(f"img{i} m={m:.6g}: {int((d > 0).sum())} px")
        print("\n== TrivialAugmentWide ops (ours vs autoaugment._apply_op on uint8 tensors)")
        print(f"{'op':13s} {'cases':>6s} {'values differing':>18s} {'max |diff|':>10s}  examples")
        for name in names:
            n, bad, mx, total, ex = stats[name]
            print(f"{name:13s} {n:6d} {bad:8d} / {total:8d} {mx:10d}  {'; '.join(ex)}")

        # 3. ColorJitter.
        cases, lines = [], []
        for k in range(args.jitter_cases):
            i = k % len(imgs)
            img = imgs[i]
            h, w, c = img.shape
            x = [rng.choice([0.0, rng.uniform(0.05, 0.9)]) for _ in range(3)]
            x.append(rng.choice([0.0, rng.uniform(0.01, 0.5)]))
            f = [rng.uniform(max(0.0, 1 - x[j]), 1 + x[j]) for j in range(3)]
            f.append(rng.uniform(-x[3], x[3]))
            f = [float(np.float32(v)) for v in f]  # torch's draws are float32
            order = list(range(4))
            rng.shuffle(order)
            out = os.path.join(tmp, f"j{k}.f32")
            cases.append((i, x, f, order, out))
            lines.append(f"{raw[i]} {h} {w} {c} {out} jitter "
                         + " ".join(repr(v) for v in x + f) + " " + " ".join(map(str, order)))
        run_dump(args.dump, lines)
        worst, worst_case, over = 0.0, None, 0
        total = 0
        for i, x, f, order, out in cases:
            img = imgs[i]
            h, w, c = img.shape
            cj = ColorJitter(*x)
            draw = (torch.tensor(order),) + tuple(
                None if getattr(cj, n) is None else f[j]
                for j, n in enumerate(["brightness", "contrast", "saturation", "hue"]))
            cj.get_params = lambda *a, draw=draw: draw
            ref = cj(F.to_tensor(img)).numpy()
            got = np.fromfile(out, dtype=np.float32).reshape(c, h, w)
            d = np.abs(got - ref)
            total += d.size
            over += int((d > 1e-5).sum())
            if d.max() > worst:
                worst, worst_case = float(d.max()), (i, x, f, order)
        print("\n== ColorJitter (ours vs torchvision's ColorJitter on ToTensor's float image)")
        print(f"{len(cases)} cases: max |diff| {worst:.3g} (in [0, 1] units; 1/255 = 0.0039); "
              f"values differing by > 1e-5: {over} / {total}")
        if worst_case:
            print(f"worst case: image {worst_case[0]}, options {worst_case[1]}, factors "
                  f"{worst_case[2]}, order {worst_case[3]}")


if __name__ == "__main__":
    main()
