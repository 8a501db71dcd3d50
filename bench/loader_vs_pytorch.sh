#!/usr/bin/env bash
# loader_vs_pytorch.sh: cnnflow's data loader vs PyTorch's DataLoader + PIL
# vs the physical limit (TurboJPEG decoding the same bytes), on two
# encoded-JPEG LMDBs, side by side in one run (issue 3).
#
# Data sets (made if missing; both under the git-ignored data/):
#   cifar10:  data/cifar10-train.lmdb (scripts/prepare_cifar10.sh, 50,000
#             records); augmentation pad 4 + random crop 32 + hflip + normalize.
#             Raw and single-thread rows decode the first --cifar-records
#             records (20,000); both loaders sample the whole LMDB, shuffled
#   photo256: N 256x256 crops (fixed seed) of the JPEG wallpapers in
#             /usr/share/wallpapers (plasma-workspace-wallpapers), each
#             wallpaper first resized to a 512-pixel short side, saved as JPEG
#             quality 90 in 2 classes, converted with `cnnflow convert
#             --encoded`; augmentation random crop 224 + hflip + normalize
# For each set it runs
#   BUILD/bench/loader_bench CONFIG   raw TurboJPEG 1 thread (the limit) and 2,
#       the same + a plain loop writing each sample's floats into a batch
#       (what any float loader writes; no crop, flip or normalisation),
#       cnnflow's per-sample read 1 thread, cnnflow's loader graph
#       (TuneLoader: sampler -> prefetch -> load, train step cut out) with
#       load_threads 1 and 2, config threads: 2
#   /usr/bin/python3 bench/pytorch_loader.py   PIL decode 1 thread, PIL decode
#       + transforms 1 thread, DataLoader num_workers 0, 1, 2
# and prints one table per set: setting | images/s | ratio to raw TurboJPEG.
#
# usage: bench/loader_vs_pytorch.sh [BUILD_DIR (default build)] [--out FILE]
#          [--reps R] [--cifar-records N] [--photos N] [--quick]
# Builds nothing: needs BUILD_DIR/bench/loader_bench and BUILD_DIR/cnnflow
#   (ninja -C BUILD_DIR loader_bench cnnflow, with CNNFLOW_BUILD_BENCH=ON).
# Takes ~3 minutes on the 2-core reference machine (first run: +~30 s to
# make the photo set).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD=build
OUT=""
REPS=3
CIFAR_RECORDS=20000
PHOTOS=3000
QUICK=0
PYTHON=/usr/bin/python3   # Debian's interpreter: torch, PIL, lmdb (the pyenv on PATH has none)

usage() { sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --reps) REPS="$2"; shift 2 ;;
    --cifar-records) CIFAR_RECORDS="$2"; shift 2 ;;
    --photos) PHOTOS="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
    *) BUILD="$1"; shift ;;
  esac
done
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
BENCH="$BUILD/bench/loader_bench"
CNNFLOW="$BUILD/cnnflow"
for bin in "$BENCH" "$CNNFLOW"; do
  if [[ ! -x "$bin" ]]; then
    echo "loader_vs_pytorch: $bin not found; build it first:" >&2
    echo "  cmake -S $ROOT -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DCNNFLOW_BUILD_BENCH=ON && ninja -C $BUILD loader_bench cnnflow" >&2
    exit 1
  fi
done
if ! "$PYTHON" -c "import torch, PIL, lmdb" 2>/dev/null; then
  echo "loader_vs_pytorch: $PYTHON lacks torch, PIL or lmdb (apt-get install python3-torch python3-pil python3-lmdb)" >&2
  exit 1
fi

# Timed work per setting (the sizes behind "~3 minutes").
CIFAR_STEPS=300; CIFAR_PT_STEPS=100
PHOTO_PT_STEPS=24
PT_SINGLE_CIFAR=5000     # records for PyTorch's single-thread rows (PIL is slow)
PT_SINGLE_PHOTO=1500
if [[ $QUICK -eq 1 ]]; then
  REPS=1; CIFAR_STEPS=60; CIFAR_PT_STEPS=20; PHOTO_PT_STEPS=6; PT_SINGLE_CIFAR=1000; PT_SINGLE_PHOTO=300
fi

# glibc serves blocks over 128 KiB with a fresh mmap, so every 600 KB
# float image PyTorch's transforms allocate is new pages to fault in; fixed
# thresholds keep them on the heap (PyTorch's decode + transforms: ~+50%,
# bench/README.md). Set for both sides; cnnflow showed no difference.
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456

TMP="$(mktemp -d /tmp/loader_vs_pytorch.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
log() { echo "# $*" >&2; }

# ---- data -------------------------------------------------------------------
cd "$ROOT"
mkdir -p data
CIFAR_LMDB="$ROOT/data/cifar10-train.lmdb"
if [[ ! -e "$CIFAR_LMDB" ]]; then
  log "making $CIFAR_LMDB (as scripts/prepare_cifar10.sh, with $CNNFLOW)"
  [[ -d data/cifar10-jpeg ]] || tar xzf "$ROOT/../shared/data/cifar10-jpeg.tar.gz" -C data
  "$CNNFLOW" convert --from folder data/cifar10-jpeg/train --to "$CIFAR_LMDB" --shuffle --overwrite >&2
fi

PHOTO_DIR="$ROOT/data/photo256-$PHOTOS"
PHOTO_LMDB="$ROOT/data/photo256-$PHOTOS-train.lmdb"
if [[ ! -e "$PHOTO_LMDB" ]]; then
  log "making $PHOTO_DIR: $PHOTOS crops of 256x256 from /usr/share/wallpapers"
  rm -rf "$PHOTO_DIR"
  "$PYTHON" - "$PHOTO_DIR" "$PHOTOS" <<'EOF'
import glob, os, random, sys
from PIL import Image
out, n = sys.argv[1], int(sys.argv[2])
# The largest JPEG of each wallpaper (names are WIDTHxHEIGHT.jpg).
walls = []
for d in sorted(glob.glob("/usr/share/wallpapers/*/contents/images")):
    jpgs = glob.glob(os.path.join(d, "*.jpg"))
    if jpgs:
        area = lambda p: eval(os.path.basename(p)[:-4].replace("x", "*"))
        walls.append(max(jpgs, key=area))
if len(walls) < 2:
    sys.exit("need the JPEG wallpapers of plasma-workspace-wallpapers in /usr/share/wallpapers")
rng = random.Random(1234)
per = [n // len(walls) + (i < n % len(walls)) for i in range(len(walls))]
for i, (path, count) in enumerate(zip(walls, per)):
    name = path.split("/")[-4]
    cls = os.path.join(out, "class%d" % (i % 2))  # two classes: wallpaper index parity
    os.makedirs(cls, exist_ok=True)
    img = Image.open(path).convert("RGB")
    # Photo-like detail per pixel: shrink to a 512-pixel short side first
    # (a 256 crop of a 5K wallpaper is mostly smooth sky).
    w, h = img.size
    s = 512 / min(w, h)
    img = img.resize((max(256, round(w * s)), max(256, round(h * s))), Image.BICUBIC)
    w, h = img.size
    for k in range(count):
        x, y = rng.randrange(w - 255), rng.randrange(h - 255)
        img.crop((x, y, x + 256, y + 256)).save(os.path.join(cls, "%s-%04d.jpg" % (name, k)),
                                                quality=90)
print("# %d crops of %d wallpapers in %s" % (n, len(walls), out), file=sys.stderr)
EOF
  "$CNNFLOW" convert --from folder "$PHOTO_DIR" --to "$PHOTO_LMDB" --encoded --shuffle --overwrite >&2
fi

# ---- configs (train step cut out by the tuner: a trivial model will do) ---------
# The graph template the repository's CIFAR-10 config uses (follows renames).
TEMPLATE=$(sed -n 's/^graph: *{ *template: *\([^,} ]*\).*/\1/p' "$ROOT/configs/cifar10.yaml")
[[ -n "$TEMPLATE" && -f "$ROOT/$TEMPLATE" ]] || { echo "loader_vs_pytorch: no graph template found in configs/cifar10.yaml" >&2; exit 1; }
cat > "$TMP/cifar10.yaml" <<EOF
name: loader-bench-cifar10
seed: 42
threads: 2
data:
  train: {source: lmdb, path: $CIFAR_LMDB, shape: [3, 32, 32], pad: 4, random_crop: true, hflip: true}
  transform: [{normalize: {mean: [0.4914, 0.4822, 0.4465], std: [0.2470, 0.2435, 0.2616]}}]
  on_bad_record: fail
model:
  input: [3, 32, 32]
  layers:
    - {name: gap, global_avgpool: {}}
    - {name: flatten, flatten: {}}
    - {name: fc, linear: {out: 10}}
train: {epochs: 1, batch: 128, optimizer: {sgd: {lr: 0.01}}}
graph: {template: $ROOT/$TEMPLATE, devices: [cpu:0], prefetch: 4, load_threads: 2}
EOF
sed -e "s|name: loader-bench-cifar10|name: loader-bench-photo256|" \
    -e "s|train: {source: lmdb.*|train: {source: lmdb, path: $PHOTO_LMDB, shape: [3, 224, 224], random_crop: true, hflip: true}|" \
    -e "s|normalize: {mean: \[0.4914, 0.4822, 0.4465\], std: \[0.2470, 0.2435, 0.2616\]}|normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}|" \
    -e "s|input: \[3, 32, 32\]|input: [3, 224, 224]|" \
    -e "s|linear: {out: 10}|linear: {out: 2}|" "$TMP/cifar10.yaml" > "$TMP/photo256.yaml"

# ---- runs -------------------------------------------------------------------------
RAW="$TMP/raw.txt"
: > "$RAW"
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
START=$(date +%s)
{
  echo "# loader_vs_pytorch.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')"
  echo "# cnnflow: $BENCH ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') + working tree)"
  echo "# both sides: MALLOC_MMAP_THRESHOLD_=$MALLOC_MMAP_THRESHOLD_ MALLOC_TRIM_THRESHOLD_=$MALLOC_TRIM_THRESHOLD_; batch 128; 2 threads / workers at most"
} >> "$RAW"

run_set() {  # name config lmdb records cnnflow_steps pt_steps pt_single_records
  local name=$1 config=$2 lmdb=$3 records=$4 steps=$5 pt_steps=$6 pt_single=$7
  log "$name: loader_bench (load $(loadavg))"
  echo "## $name loadavg_before=$(loadavg | tr ' ' ,)" >> "$RAW"
  "$BENCH" "$config" --records "$records" --reps "$REPS" --steps "$steps" --threads 1,2 \
    --prefetch 4 | sed "s/^/$name /" >> "$RAW"
  log "$name: pytorch_loader.py (load $(loadavg))"
  "$PYTHON" "$ROOT/bench/pytorch_loader.py" --lmdb "$lmdb" --preset "${name%%[0-9]*}" \
    --records 0 --single-records "$pt_single" --workers 0,1,2 --batch 128 \
    --steps "$pt_steps" --max-seconds 8 --warmup 3 --reps "$REPS" --threads 2 | sed "s/^/$name /" >> "$RAW"
  echo "## $name loadavg_after=$(loadavg | tr ' ' ,)" >> "$RAW"
}

# The photo set's whole epoch is ceil(PHOTOS/128) batches: the loader graph
# measures whole epochs.
PHOTO_STEPS=$(( (PHOTOS + 127) / 128 ))
run_set cifar10 "$TMP/cifar10.yaml" "$CIFAR_LMDB" "$CIFAR_RECORDS" "$CIFAR_STEPS" "$CIFAR_PT_STEPS" "$PT_SINGLE_CIFAR"
run_set photo256 "$TMP/photo256.yaml" "$PHOTO_LMDB" "$PHOTOS" "$PHOTO_STEPS" "$PHOTO_PT_STEPS" "$PT_SINGLE_PHOTO"
echo "# total $(( $(date +%s) - START )) s" >> "$RAW"

# ---- tables -----------------------------------------------------------------------
"$PYTHON" - "$RAW" "$REPS" > "$TMP/table.txt" <<'EOF'
import sys
raw, reps = sys.argv[1], sys.argv[2]
rows = {}
for line in open(raw):
    f = line.split()
    if len(f) < 2 or line.startswith("#"):
        continue
    kv = dict(x.split("=", 1) for x in f[2:] if "=" in x)
    rows.setdefault(f[0], []).append((f[1], kv))

def find(rows, kind, **match):
    for k, kv in rows:
        if k == kind and all(kv.get(a) == str(b) for a, b in match.items()):
            return kv
    return None

out = []
for name, rs in rows.items():
    if name.startswith("##"):
        continue
    raw_kv = find(rs, "raw_turbojpeg", threads=1)
    limit = float(raw_kv["images_per_s"])
    table = [
        ("TurboJPEG raw decode, 1 thread (the limit)", raw_kv),
        ("TurboJPEG raw decode, 2 threads", find(rs, "raw_turbojpeg", threads=2)),
        ("TurboJPEG decode + a plain loop writing the sample's floats into a batch, 1 thread", find(rs, "raw_turbojpeg_floats", threads=1)),
        ("TurboJPEG decode + a plain loop writing the sample's floats into a batch, 2 threads", find(rs, "raw_turbojpeg_floats", threads=2)),
        ("cnnflow Dataset::Read (decode + augment + normalize), 1 thread, no graph", find(rs, "cnnflow_read")),
        ("cnnflow loader graph, load_threads 1", find(rs, "cnnflow_loader", load_threads=1)),
        ("cnnflow loader graph, load_threads 2", find(rs, "cnnflow_loader", load_threads=2)),
        ("PIL decode only, 1 thread, no DataLoader", find(rs, "pytorch_pil_decode")),
        ("PIL decode + transforms, 1 thread, no DataLoader", find(rs, "pytorch_pil_transform")),
        ("PyTorch DataLoader + PIL, num_workers 0", find(rs, "pytorch_loader", num_workers=0)),
        ("PyTorch DataLoader + PIL, num_workers 1", find(rs, "pytorch_loader", num_workers=1)),
        ("PyTorch DataLoader + PIL, num_workers 2", find(rs, "pytorch_loader", num_workers=2)),
    ]
    single = find(rs, "pytorch_pil_decode")
    out.append(f"### {name}: mean JPEG {raw_kv['mean_bytes']} bytes, "
               f"{int(float(raw_kv['mean_pixels']))} pixels; raw and cnnflow read rows over the first "
               f"{raw_kv['records']} records, PIL rows over {single['records'] if single else '?'}, "
               f"loaders over the whole LMDB\n")
    out.append(f"| setting | images/s (median of {reps}) | ratio to raw TurboJPEG 1-thread | best of {reps} | CPU cores used |")
    out.append("|---|---:|---:|---:|---:|")
    for label, kv in table:
        if kv is None:
            out.append(f"| {label} | (missing) | | | |")
            continue
        v = float(kv["images_per_s"])
        cores = f"{float(kv['cpu_cores']):.2f}" if "cpu_cores" in kv else "1 (one thread)"
        out.append(f"| {label} | {v:,.0f} | {v / limit:.2f} | {float(kv['best']):,.0f} | {cores} |")
    out.append("")
print("\n".join(out))
EOF
grep '^# ' "$RAW" | grep -v '^# total' || true
echo
cat "$TMP/table.txt"
echo "# load average per set (1, 5, 15 min): $(grep -o 'loadavg_[a-z]*=[0-9.,]*' "$RAW" | tr '\n' ' ')"
echo "# $(tail -1 "$RAW" | sed 's/^# //')"
if [[ -n "$OUT" ]]; then
  { cat "$TMP/table.txt"; echo "# raw lines:"; cat "$RAW"; } > "$OUT"
  log "wrote $OUT"
fi
