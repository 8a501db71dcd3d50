#!/usr/bin/env python3
"""cnnflow.Loader against torch's DataLoader + torchvision, in a PyTorch loop.

Both read the CIFAR-10 JPEG folder (ImageFolder layout, 32x32 JPEGs) with
the same training augmentation: pad 4 + random 32x32 crop, horizontal flip
(p 0.5), ToTensor, Normalize. Two figures per side, on the same CPU budget
(--cores, 2 on this machine):

  loader: images/s of the loader alone (each batch turned into a torch
          tensor, nothing else), cnnflow at `threads` decode threads against
          DataLoader at `num_workers` workers;
  train:  images/s of a plain PyTorch training loop (the CNN of
          configs/cifar10.yaml, SGD, batch 128) fed by each loader, at each
          split of the cores between loading (decode threads or workers) and
          torch's intra-op threads; each side is reported at its best split.

Every figure is the median of --rounds runs, the two sides alternating, each
run timing --batches batches after --warmup. One key=value line per run and
a table at the end.

--dataset photos (issue 33) does the same on real photos at ImageNet-like
sizes (scripts/prepare_photos.py: data/photos/train, 800 JPEGs of 333-500
px, 10 classes): resize the short side to 256, random 224x224 crop,
horizontal flip, ToTensor, ImageNet Normalize (torchvision's Resize(256),
RandomCrop(224), RandomHorizontalFlip() on an ImageFolder), feeding the
small conv model of bench/configs/photos_loader_bound.yaml, batch 32 (that
config's train.batch), 20 timed batches after 3 by default.

  python bench/python_loader_vs_dataloader.py --data data/cifar10-jpeg/train
  python bench/python_loader_vs_dataloader.py --dataset photos
(a python with torch, torchvision and the cnnflow package: `pip install .`
into that venv, or PYTHONPATH at an installed copy of the package).
"""

import argparse
import statistics
import time

import torch
import torchvision
import torchvision.transforms as T

import cnnflow

MEAN, STD = [0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]
# --dataset photos: ImageNet's, as bench/configs/photos_loader_bound.yaml.
PHOTO_MEAN, PHOTO_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def cnnflow_loader(args, threads):
    if args.dataset == "photos":
        spec = {"source": "folder", "path": args.data, "shape": [3, 224, 224],
                "resize_min_side": 256, "random_crop": True, "hflip": True}
        mean, std = PHOTO_MEAN, PHOTO_STD
    else:
        spec = {"source": "folder", "path": args.data, "shape": [3, 32, 32], "pad": 4,
                "random_crop": True, "hflip": True}
        mean, std = MEAN, STD
    loader = cnnflow.Loader(spec, batch=args.batch, shuffle=True, seed=0, threads=threads,
                            prefetch=4, drop_last=True,
                            transform=[{"normalize": {"mean": mean, "std": std}}])
    return loader.torch


def torch_loader(args, workers):
    if args.dataset == "photos":
        tf = T.Compose([T.Resize(256), T.RandomCrop(224), T.RandomHorizontalFlip(),
                        T.ToTensor(), T.Normalize(PHOTO_MEAN, PHOTO_STD)])
    else:
        tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                        T.Normalize(MEAN, STD)])
    data = torchvision.datasets.ImageFolder(args.data, transform=tf)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True,
                                         num_workers=workers, drop_last=True,
                                         persistent_workers=False, prefetch_factor=4)
    return lambda: iter(loader)


def photo_model():
    """bench/configs/photos_loader_bound.yaml's network (maxpool2d's stride
    defaults to its kernel, conv2d has a bias, as torch's): 224 -> 56 -> 14."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 7, stride=4, padding=3), torch.nn.ReLU(), torch.nn.MaxPool2d(4),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))


def model():
    """configs/cifar10.yaml's network."""
    def block(i, o):
        return [torch.nn.Conv2d(i, o, 3, padding=1, bias=False), torch.nn.BatchNorm2d(o),
                torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
    return torch.nn.Sequential(*block(3, 32), *block(32, 64), *block(64, 128),
                               torch.nn.Flatten(), torch.nn.Linear(2048, 256), torch.nn.ReLU(),
                               torch.nn.Dropout(0.3), torch.nn.Linear(256, 10))


def timed(epoch_iter, args, step=None):
    """images/s over `batches` batches after `warmup`."""
    it = epoch_iter()
    n, t0 = 0, None
    for i, (x, y) in enumerate(it):
        if step:
            step(x, y)
        if i == args.warmup - 1:
            t0 = time.perf_counter()
        elif i >= args.warmup:
            n += x.shape[0]
        if i + 1 == args.warmup + args.batches:
            break
    seconds = time.perf_counter() - t0
    del it
    return n / seconds


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", choices=["cifar", "photos"], default="cifar",
                   help="cifar: CIFAR-10 JPEGs, configs/cifar10.yaml's CNN (default); photos: "
                        "data/photos, bench/configs/photos_loader_bound.yaml's model")
    p.add_argument("--data", help="default data/cifar10-jpeg/train or data/photos/train")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--batch", type=int, help="default 128 (cifar) or 32 (photos)")
    p.add_argument("--batches", type=int, help="default 40 (cifar) or 20 (photos)")
    p.add_argument("--warmup", type=int, help="default 5 (cifar) or 3 (photos)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-train", action="store_true", help="the loaders alone")
    args = p.parse_args()
    photos = args.dataset == "photos"
    for key, cifar, photo in (("data", "data/cifar10-jpeg/train", "data/photos/train"),
                              ("batch", 128, 32), ("batches", 40, 20), ("warmup", 5, 3)):
        if getattr(args, key) is None:
            setattr(args, key, photo if photos else cifar)
    make_model = photo_model if photos else model
    results = {}

    def record(kind, side, load, torch_threads, rate):
        results.setdefault((kind, side, load, torch_threads), []).append(rate)
        print(f"{kind} side={side} load={load} torch_threads={torch_threads} "
              f"images_per_s={rate:.0f}", flush=True)

    loaders = {"cnnflow": cnnflow_loader, "dataloader": torch_loader}
    for _ in range(args.rounds):
        torch.set_num_threads(1)
        for side, make in loaders.items():
            record("loader", side, args.cores, 1, timed(make(args, args.cores), args))
        if args.no_train:
            continue
        # The splits of the cores: loading threads (or workers) + torch's.
        for load in range(1, args.cores + 1):
            for torch_threads in sorted({max(1, args.cores - load), args.cores}):
                for side, make in loaders.items():
                    torch.set_num_threads(torch_threads)
                    torch.manual_seed(0)
                    net = make_model()
                    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)

                    def step(x, y):
                        opt.zero_grad()
                        torch.nn.functional.cross_entropy(net(x), y).backward()
                        opt.step()

                    record("train", side, load, torch_threads,
                           timed(make(args, load), args, step))

    head = f"photos ({args.data}), " if photos else ""
    print(f"\n{head}{args.cores} cores, batch {args.batch}, median of {args.rounds} rounds of "
          f"{args.batches} batches after {args.warmup}; torch {torch.__version__}, "
          f"torchvision {torchvision.__version__}")
    print("| figure | side | load threads / workers | torch threads | images/s |")
    print("|---|---|---:|---:|---:|")
    best = {}
    for (kind, side, load, tt), rates in sorted(results.items()):
        m = statistics.median(rates)
        print(f"| {kind} | {side} | {load} | {tt} | {m:.0f} |")
        if m > best.get((kind, side), (0,))[0]:
            best[(kind, side)] = (m, load, tt)
    for kind in ("loader", "train"):
        if (kind, "cnnflow") in best and (kind, "dataloader") in best:
            c, d = best[(kind, "cnnflow")], best[(kind, "dataloader")]
            print(f"{kind}: cnnflow {c[0]:.0f} img/s (load {c[1]}, torch {c[2]}) vs DataLoader "
                  f"{d[0]:.0f} img/s (workers {d[1]}, torch {d[2]}): {c[0] / d[0]:.2f}x")


if __name__ == "__main__":
    main()
