#!/usr/bin/env bash
# The Free Spoken Digit Dataset for configs/spoken_digits.yaml: extracts the
# tarball that ships in ../shared/data into the git-ignored data/ folder
# (data/fsdd/recordings/{digit}_{speaker}_{n}.wav, 3000 clips of 8 kHz 16-bit
# mono). Idempotent: an existing, complete extraction is kept. The `wav`
# source reads the files directly (train/test split by file name); with
# --lmdb it also writes data/fsdd-{train,test}.lmdb (f32 [1, L] records) for
# the `lmdb` source.
#   scripts/prepare_fsdd.sh [--lmdb] [TARBALL]
set -euo pipefail
cd "$(dirname "$0")/.."
lmdb=0
if [[ "${1:-}" == "--lmdb" ]]; then lmdb=1; shift; fi
tarball="${1:-../shared/data/fsdd-spoken-digits.tar.gz}"
dest=data/fsdd/recordings
mkdir -p data
count=0
[[ -d "$dest" ]] && count=$(find "$dest" -maxdepth 1 -name '*.wav' | wc -l)
if [[ "$count" -lt 3000 ]]; then
  # Extract into a temporary folder and rename, so an interrupted run never
  # leaves a half-filled data/fsdd behind.
  tmp=$(mktemp -d data/.fsdd.XXXXXX)
  trap 'rm -rf "$tmp"' EXIT
  tar xzf "$tarball" -C "$tmp"
  rm -rf data/fsdd
  mv "$tmp/fsdd" data/fsdd
  count=$(find "$dest" -maxdepth 1 -name '*.wav' | wc -l)
fi
echo "FSDD: $count recordings in $dest"
if [[ "$lmdb" == 1 ]]; then
  cnnflow=${CNNFLOW:-build/cnnflow}
  "$cnnflow" convert --from wav "$dest" --label-regex '^(\d+)_' --select '_([5-9]|[1-9][0-9]+)\.wav$' \
    --to data/fsdd-train.lmdb --shuffle --overwrite
  "$cnnflow" convert --from wav "$dest" --label-regex '^(\d+)_' --select '_[0-4]\.wav$' \
    --to data/fsdd-test.lmdb --overwrite
fi
