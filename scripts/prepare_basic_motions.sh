#!/usr/bin/env bash
# BasicMotions (UEA archive, sktime's .ts copy) for configs/basic_motions.yaml:
# data/ucr/BasicMotions_{TRAIN,TEST}.ts. Without DIR both files are downloaded
# from sktime's repository at a pinned commit; DIR is a local folder holding
# them (this machine's ../shared/data/ucr). Either way each file's SHA-256 is
# checked against the pinned one (sktime's files at that commit, byte for byte
# the copies in ../shared/data/ucr).
#   scripts/prepare_basic_motions.sh [DIR]
# CNNFLOW_DATA_DIR: another folder than data/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/fetch.sh
commit=7bd7d1620c0656f3210eeb850bb1c0034159ee47
base=${CNNFLOW_UCR_URL:-https://raw.githubusercontent.com/sktime/sktime/$commit/sktime/datasets/data/BasicMotions}
declare -A sha256=(
  [BasicMotions_TRAIN.ts]=${CNNFLOW_UCR_TRAIN_SHA256:-8dc43cc6306cb679c888c01e26f91772ac4441a916da43bac8b79734a538b9d6}
  [BasicMotions_TEST.ts]=${CNNFLOW_UCR_TEST_SHA256:-79213102bc6fca1a398ad98ce1185dff0208fa3d1465e687f48288946b0ff8dc}
)
data=${CNNFLOW_DATA_DIR:-data}
dir=${1:-}
mkdir -p "$data/ucr"
for name in BasicMotions_TRAIN.ts BasicMotions_TEST.ts; do
  if [[ -n "$dir" ]]; then
    [[ -f "$dir/$name" ]] || { echo "error: no $dir/$name" >&2; exit 1; }
    verify_sha256 "$dir/$name" "${sha256[$name]}"
    cp "$dir/$name" "$data/ucr/$name.tmp"
    mv "$data/ucr/$name.tmp" "$data/ucr/$name"
  else
    fetch_verified "$base/$name" "${sha256[$name]}" "$data/ucr/$name"
  fi
done
echo "BasicMotions in $data/ucr (configs/basic_motions.yaml)"
