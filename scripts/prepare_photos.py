#!/usr/bin/python3
"""Real photos at ImageNet-like sizes for the loader-bound benchmark
(bench/configs/photos_loader_bound.yaml).

Takes the JPEG and PNG wallpapers of the Debian package
plasma-workspace-wallpapers (real photos up to 5120x2880 under
/usr/share/wallpapers/), cuts random crops of ImageNet-like sizes out of
them (the short side 333-500 px, aspect 4:3, 3:4, 3:2 or 1:1), and
re-encodes each as a JPEG of quality 90 into an image folder:
data/photos/{train,test}/<wallpaper>/<n>.jpg, the class being the
wallpaper the crop came from. Deterministic (seeded); idempotent (an
existing complete folder is kept); written to a temporary folder and
renamed, so an interrupted run leaves nothing half-made.

  scripts/prepare_photos.py [--train N] [--test M] [--classes K]

Needs python3-pil and plasma-workspace-wallpapers
(CNNFLOW_SETUP_BENCH=1 scripts/setup.sh installs both).
"""
import argparse
import os
import random
import shutil
import sys
import tempfile

from PIL import Image

WALLPAPERS = "/usr/share/wallpapers"
SIZES = [(500, 375), (375, 500), (500, 333), (333, 500), (500, 500), (448, 336)]


def sources(root):
    """The largest image of each wallpaper, by name."""
    out = {}
    for name in sorted(os.listdir(root)):
        images = os.path.join(root, name, "contents", "images")
        if not os.path.isdir(images):
            continue
        best, best_px = None, 0
        for f in os.listdir(images):
            stem, ext = os.path.splitext(f)
            if ext.lower() not in (".jpg", ".jpeg", ".png") or "x" not in stem:
                continue
            try:
                w, h = (int(v) for v in stem.split("x"))
            except ValueError:
                continue
            if w * h > best_px:
                best, best_px = os.path.join(images, f), w * h
        if best:
            out[name] = best
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=800, help="train crops (default 800)")
    ap.add_argument("--test", type=int, default=200, help="test crops (default 200)")
    ap.add_argument("--classes", type=int, default=10, help="wallpapers used as classes (default 10)")
    ap.add_argument("--out", default="data/photos")
    a = ap.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if not os.path.isdir(WALLPAPERS):
        sys.exit(f"prepare_photos: {WALLPAPERS} is missing: apt-get install plasma-workspace-wallpapers")
    src = sources(WALLPAPERS)
    names = sorted(src)[: a.classes]
    if len(names) < a.classes:
        sys.exit(f"prepare_photos: {len(names)} wallpapers in {WALLPAPERS}, {a.classes} asked for")
    marker = os.path.join(a.out, f".complete-{a.train}-{a.test}-{a.classes}")
    if os.path.exists(marker):
        print(f"photos: {a.train} train and {a.test} test JPEGs already in {a.out}")
        return
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".photos.", dir=os.path.dirname(a.out) or ".")
    try:
        rng = random.Random(20261201)
        images = {n: Image.open(src[n]).convert("RGB") for n in names}
        for split, count in (("train", a.train), ("test", a.test)):
            for i in range(count):
                name = names[i % len(names)]
                img = images[name]
                w, h = rng.choice(SIZES)
                # A crop of 1-3x the target, scaled to it: photos at many scales.
                s = rng.uniform(1.0, min(3.0, img.width / w, img.height / h))
                cw, ch = int(w * s), int(h * s)
                x, y = rng.randrange(img.width - cw + 1), rng.randrange(img.height - ch + 1)
                crop = img.crop((x, y, x + cw, y + ch)).resize((w, h), Image.BILINEAR)
                d = os.path.join(tmp, split, name)
                os.makedirs(d, exist_ok=True)
                crop.save(os.path.join(d, f"{i:05d}.jpg"), quality=90)
        open(os.path.join(tmp, os.path.basename(marker)), "w").close()
        shutil.rmtree(a.out, ignore_errors=True)
        os.rename(tmp, a.out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"photos: {a.train} train and {a.test} test JPEGs of {len(names)} classes in {a.out}")


if __name__ == "__main__":
    main()
