#!/usr/bin/env bash
# A checkpoint damaged on disk after it was written: `cnnflow train
# --resume` warns, names the file it skips and why, and resumes from the
# previous valid checkpoint. Two damages, one after the other: bytes flipped
# in the newest data file (its size is right, its CRC-32 is not), then the
# newest data file truncated.
#   usage: checkpoint_corrupt_test.sh CNNFLOW_BINARY
set -u
source "$(dirname "$0")/fault_lib.sh"
cnnflow="$1"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sets=(--set train.epochs=1 --set train.max_steps=30 --set train.checkpoint_every=10
      --set threads=2)
ck="$out/run/checkpoints"
train_expect 0 "$out/log" "${sets[@]}" --out "$out/run"
check_checkpoints "$ck" || { echo "FAIL: the run's own checkpoints are not valid"; exit 1; }

# resume_skipping DAMAGE: --resume must skip step 30 for DAMAGE and take step 20.
resume_skipping() {
  local log="$out/log.${1// /_}"
  train_expect 0 "$log" "${sets[@]}" --resume "$out/run"
  grep -E "^resum" "$log" | sed 's/^/  | /'
  grep -qE "resume: skipped step-000000030: .*$2.*step-000000030\.safetensors" "$log" ||
    { echo "FAIL: $1: no warning naming the damaged step-000000030"; exit 1; }
  grep -qE "resuming .*/step-000000020\.safetensors: epoch 1, batch 20, step 20" "$log" ||
    { echo "FAIL: $1: did not resume from the previous checkpoint, step 20"; exit 1; }
  grep -q "done after epoch 1" "$log" || { echo "FAIL: $1: the resumed run did not finish"; exit 1; }
  check_checkpoints "$ck" > /dev/null || { echo "FAIL: $1: the resumed run left invalid checkpoints"; exit 1; }
}

# 1. Flip 16 bytes in the middle of the newest data file (size unchanged).
data="$ck/step-000000030.safetensors"
size=$(stat -c %s "$data")
head -c 16 /dev/urandom | dd of="$data" bs=1 seek=$((size / 2)) count=16 conv=notrunc status=none
resume_skipping "flipped bytes" "data file's CRC-32 is [0-9a-f]+, sidecar says [0-9a-f]+"
# 2. The resumed run rewrote step 30: cut it in half.
truncate -s $(($(stat -c %s "$data") / 2)) "$data"
resume_skipping "truncated" "data file is [0-9]+ bytes, sidecar says [0-9]+"
echo "PASS: damaged checkpoints skipped with a warning naming them; resumed from the previous one"
