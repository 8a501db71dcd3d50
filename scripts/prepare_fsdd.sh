#!/usr/bin/env bash
# The Free Spoken Digit Dataset for configs/spoken_digits.yaml, into the
# git-ignored data/ folder: data/fsdd/recordings/{digit}_{speaker}_{n}.wav
# (8 kHz 16-bit mono). Without FILE it downloads the repository's v1.0.9
# archive (2500 recordings) and checks its SHA-256; FILE is a local archive
# holding a recordings/ folder: a local copy of that archive (its top folder
# free-spoken-digit-dataset-1.0.9/) is checked against the same hash; other
# archives have no published checksum (this machine's
# ../shared/data/fsdd-spoken-digits.tar.gz, 3000 recordings, is one).
# Idempotent: a complete extraction is kept. The `wav` source reads
# the files directly (train/test split by file name); with --lmdb it also
# writes data/fsdd-{train,test}.lmdb (f32 [1, L] records) for `lmdb`.
#   scripts/prepare_fsdd.sh [--lmdb] [FILE]
# CNNFLOW_DATA_DIR: another folder than data/; CNNFLOW=path of the cnnflow binary.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/fetch.sh
# The v1.0.9 tag's archive, 11975353 bytes; the SHA-256 TensorFlow Datasets pins
# for it (tensorflow_datasets/audio/spoken_digit/checksums.tsv).
url=${CNNFLOW_FSDD_URL:-https://github.com/Jakobovski/free-spoken-digit-dataset/archive/v1.0.9.tar.gz}
sha256=${CNNFLOW_FSDD_SHA256:-8bc44cde129d505cbbb6b365c09f80c663f2aa77578afc634e6141a2f87100c0}
data=${CNNFLOW_DATA_DIR:-data}
lmdb=0
if [[ "${1:-}" == "--lmdb" ]]; then lmdb=1; shift; fi
file=${1:-}
dest="$data/fsdd/recordings"
mkdir -p "$data"
if [[ ! -f "$data/fsdd/.complete" ]]; then
  if [[ -z "$file" ]]; then
    file="$data/downloads/fsdd-v1.0.9.tar.gz"
    fetch_verified "$url" "$sha256" "$file"
  fi
  [[ -f "$file" ]] || { echo "error: no file '$file'" >&2; exit 1; }
  [[ "$(tar_top "$file")" == free-spoken-digit-dataset-1.0.9 ]] && verify_sha256 "$file" "$sha256"
  # Extract into a temporary folder and rename, so an interrupted run never
  # leaves a half-filled data/fsdd behind.
  tmp=$(mktemp -d "$data/.fsdd.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  tar xzf "$file" -C "$tmp"
  recordings=$(find "$tmp" -maxdepth 3 -type d -name recordings | head -1)
  [[ -n "$recordings" ]] || { echo "error: $file holds no recordings/ folder" >&2; exit 1; }
  rm -rf "$data/fsdd"
  mkdir -p "$tmp/out"
  mv "$recordings" "$tmp/out/recordings"
  touch "$tmp/out/.complete"
  mv "$tmp/out" "$data/fsdd"
fi
count=$(find "$dest" -maxdepth 1 -name '*.wav' | wc -l)
echo "FSDD: $count recordings in $dest"
if [[ "$lmdb" == 1 ]]; then
  cnnflow=${CNNFLOW:-build/cnnflow}
  "$cnnflow" convert --from wav "$dest" --label-regex '^(\d+)_' --select '_([5-9]|[1-9][0-9]+)\.wav$' \
    --to "$data/fsdd-train.lmdb" --shuffle --overwrite
  "$cnnflow" convert --from wav "$dest" --label-regex '^(\d+)_' --select '_[0-4]\.wav$' \
    --to "$data/fsdd-test.lmdb" --overwrite
fi
