#!/usr/bin/env bash
# scripts/prepare_*.sh on small local archives (no network here): the
# download path through a file:// URL with a matching and a wrong SHA-256,
# a local file, and the official-name check on a local copy; then
# configs/cifar10_binary.yaml trains one step from the extracted batches.
#   usage: prepare_test.sh CNNFLOW_BINARY
set -u
cnnflow="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export CNNFLOW="$cnnflow"

# A tiny cifar-10-binary.tar.gz: the official layout, 4 records a batch.
python3 - "$tmp/src" <<'PY'
import os, random, sys
root = os.path.join(sys.argv[1], "cifar-10-batches-bin")
os.makedirs(root)
rng = random.Random(0)
for name in [f"data_batch_{b}.bin" for b in range(1, 6)] + ["test_batch.bin"]:
    with open(os.path.join(root, name), "wb") as f:
        for r in range(4):
            f.write(bytes([r % 10]) + bytes(rng.randrange(256) for _ in range(3072)))
open(os.path.join(root, "batches.meta.txt"), "w").write("airplane\n")
os.makedirs(os.path.join(sys.argv[1], "fsdd-1.0.9", "recordings"))
PY
tar czf "$tmp/cifar-10-binary.tar.gz" -C "$tmp/src" cifar-10-batches-bin
sha=$(sha256sum "$tmp/cifar-10-binary.tar.gz" | cut -d' ' -f1)
wrong=0000000000000000000000000000000000000000000000000000000000000000

# Download, checksum matching: extracted.
CNNFLOW_DATA_DIR="$tmp/d1" CNNFLOW_CIFAR10_URL="file://$tmp/cifar-10-binary.tar.gz" CNNFLOW_CIFAR10_SHA256=$sha \
  scripts/prepare_cifar10.sh > "$tmp/log" 2>&1 || { cat "$tmp/log"; fail "download with the right SHA-256"; }
grep -q "SHA-256 ok ($sha)" "$tmp/log" || fail "no checksum line: $(cat "$tmp/log")"
[[ $(ls "$tmp/d1/cifar-10-batches-bin" | grep -c '\.bin$') == 6 ]] || fail "not 6 batches"
# Download, checksum wrong: fails naming both hashes, nothing extracted or kept.
CNNFLOW_DATA_DIR="$tmp/d2" CNNFLOW_CIFAR10_URL="file://$tmp/cifar-10-binary.tar.gz" CNNFLOW_CIFAR10_SHA256=$wrong \
  scripts/prepare_cifar10.sh > "$tmp/log" 2>&1 && fail "a wrong SHA-256 passed"
grep -q "SHA-256 mismatch: got $sha, expected $wrong" "$tmp/log" || fail "no mismatch message: $(cat "$tmp/log")"
[[ -e "$tmp/d2/cifar-10-batches-bin" ]] && fail "extracted despite the mismatch"
[[ -n $(find "$tmp/d2" -type f) ]] && fail "left files: $(find "$tmp/d2" -type f)"
# A local copy of the official archive is checked against the pinned hash:
# this one is not the official file, so it fails without the override.
scripts/prepare_cifar10.sh "$tmp/cifar-10-binary.tar.gz" > "$tmp/log" 2>&1 && fail "a local non-official archive passed"
grep -q "expected c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd" "$tmp/log" ||
  fail "not checked against the pinned hash: $(cat "$tmp/log")"
CNNFLOW_DATA_DIR="$tmp/d3" CNNFLOW_CIFAR10_SHA256=$sha scripts/prepare_cifar10.sh "$tmp/cifar-10-binary.tar.gz" \
  > "$tmp/log" 2>&1 || { cat "$tmp/log"; fail "local archive"; }
cmp -s "$tmp/d3/cifar-10-batches-bin/test_batch.bin" "$tmp/src/cifar-10-batches-bin/test_batch.bin" || fail "test_batch differs"

# The config trains from the extracted batches.
b="$tmp/d1/cifar-10-batches-bin"
"$cnnflow" train configs/cifar10_binary.yaml --set "data.train.path=$b" --set "data.test.path=$b" \
  --set train.batch=4 --set train.epochs=1 --set threads=1 --out "$tmp/run" > "$tmp/log" 2>&1 ||
  { cat "$tmp/log"; fail "train configs/cifar10_binary.yaml"; }
grep -q "done after epoch 1: test accuracy [0-9.]*%" "$tmp/log" || fail "no test accuracy: $(cat "$tmp/log")"

# FSDD: the repository archive's layout (a top folder holding recordings/).
python3 - "$tmp/src/fsdd-1.0.9/recordings" <<'PY'
import struct, sys, os
for name in ["0_jackson_0.wav", "1_theo_7.wav"]:
    pcm = struct.pack("<8h", *range(8))
    hdr = b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 8000, 16000, 2, 16)
    open(os.path.join(sys.argv[1], name), "wb").write(hdr + b"data" + struct.pack("<I", len(pcm)) + pcm)
PY
tar czf "$tmp/fsdd.tar.gz" -C "$tmp/src" fsdd-1.0.9
fsha=$(sha256sum "$tmp/fsdd.tar.gz" | cut -d' ' -f1)
CNNFLOW_DATA_DIR="$tmp/f1" CNNFLOW_FSDD_URL="file://$tmp/fsdd.tar.gz" CNNFLOW_FSDD_SHA256=$wrong \
  scripts/prepare_fsdd.sh > "$tmp/log" 2>&1 && fail "fsdd: a wrong SHA-256 passed"
grep -q "SHA-256 mismatch" "$tmp/log" || fail "fsdd: no mismatch message: $(cat "$tmp/log")"
[[ -e "$tmp/f1/fsdd" ]] && fail "fsdd: extracted despite the mismatch"
CNNFLOW_DATA_DIR="$tmp/f1" CNNFLOW_FSDD_URL="file://$tmp/fsdd.tar.gz" CNNFLOW_FSDD_SHA256=$fsha \
  scripts/prepare_fsdd.sh > "$tmp/log" 2>&1 || { cat "$tmp/log"; fail "fsdd download"; }
grep -q "FSDD: 2 recordings in $tmp/f1/fsdd/recordings" "$tmp/log" || fail "fsdd: $(cat "$tmp/log")"
CNNFLOW_DATA_DIR="$tmp/f2" scripts/prepare_fsdd.sh --lmdb "$tmp/fsdd.tar.gz" > "$tmp/log" 2>&1 ||
  { cat "$tmp/log"; fail "fsdd local file"; }
grep -q "converted 1 records" "$tmp/log" || fail "fsdd --lmdb: $(cat "$tmp/log")"
# A local copy of the repository's v1.0.9 archive (by its top folder) is
# checked against the pinned hash: this one is not the real archive.
mv "$tmp/src/fsdd-1.0.9" "$tmp/src/free-spoken-digit-dataset-1.0.9"
tar czf "$tmp/v1.0.9.tar.gz" -C "$tmp/src" free-spoken-digit-dataset-1.0.9
CNNFLOW_DATA_DIR="$tmp/f3" scripts/prepare_fsdd.sh "$tmp/v1.0.9.tar.gz" > "$tmp/log" 2>&1 && fail "fsdd: a changed v1.0.9 archive passed"
grep -q "expected 8bc44cde129d505cbbb6b365c09f80c663f2aa77578afc634e6141a2f87100c0" "$tmp/log" ||
  fail "fsdd: not checked against the pinned hash: $(cat "$tmp/log")"

# BasicMotions: a local folder is checked against the pinned hashes (sktime's
# files); the real copies pass where this machine has them, a changed one fails.
mkdir -p "$tmp/ucr"
for d in ../shared/data/ucr /work/shared/data/ucr; do
  [[ -f "$d/BasicMotions_TRAIN.ts" ]] && cp "$d"/BasicMotions_T*.ts "$tmp/ucr/" && break
done
if [[ -f "$tmp/ucr/BasicMotions_TRAIN.ts" ]]; then
  CNNFLOW_DATA_DIR="$tmp/u1" scripts/prepare_basic_motions.sh "$tmp/ucr" > "$tmp/log" 2>&1 ||
    { cat "$tmp/log"; fail "basic motions from the real copies"; }
  cmp -s "$tmp/u1/ucr/BasicMotions_TEST.ts" "$tmp/ucr/BasicMotions_TEST.ts" || fail "TEST.ts differs"
  "$cnnflow" validate configs/basic_motions.yaml --set "data.train.path=$tmp/u1/ucr/BasicMotions_TRAIN.ts" \
    --set "data.test.path=$tmp/u1/ucr/BasicMotions_TEST.ts" > "$tmp/log" 2>&1 || { cat "$tmp/log"; fail "validate basic_motions"; }
  echo "# changed" >> "$tmp/ucr/BasicMotions_TEST.ts"
else
  printf '@data\n' > "$tmp/ucr/BasicMotions_TRAIN.ts"; cp "$tmp/ucr/BasicMotions_TRAIN.ts" "$tmp/ucr/BasicMotions_TEST.ts"
fi
CNNFLOW_DATA_DIR="$tmp/u2" scripts/prepare_basic_motions.sh "$tmp/ucr" > "$tmp/log" 2>&1 && fail "a changed .ts passed"
grep -q "SHA-256 mismatch" "$tmp/log" || fail "basic motions: $(cat "$tmp/log")"

# No config reads from ../shared.
grep -l '\.\./shared' configs/*.yaml && fail "a config refers to ../shared"
echo "PASS: prepare scripts check their SHA-256"
