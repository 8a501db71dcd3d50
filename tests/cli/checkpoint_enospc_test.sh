#!/usr/bin/env bash
# The disk fills while a checkpoint is written (ENOSPC), on a real small
# file system: the run directory on a 5 MiB tmpfs holds the first
# checkpoint (3.4 MB) but not the second. The run must fail with an error
# naming the file and the lack of space; the first checkpoint stays valid;
# nothing half-written is left under a checkpoint's name; and once there is
# room again (the tmpfs grown), `--resume` starts from the first checkpoint
# and finishes. Needs root (mount): skips (77) when mount is not permitted.
#   usage: checkpoint_enospc_test.sh CNNFLOW_BINARY
set -u
source "$(dirname "$0")/fault_lib.sh"
cnnflow="$1"
small_disk 5m
sets=(--set train.epochs=1 --set train.max_steps=30 --set train.checkpoint_every=10
      --set threads=2)
ck="$disk/run/checkpoints"
train_expect 1 "$out/log" "${sets[@]}" --out "$disk/run"  # an error, no crash
grep "error" "$out/log" | sed 's/^/  | /'
grep -qE "error: checkpoint '.*/step-000000020': .*step-000000020\.safetensors.*No space left on device; the checkpoints written before it are intact: --resume .*/run continues from the newest \(step 10\)" "$out/log" ||
  { echo "FAIL: the error does not name the checkpoint file, the lack of space and what to do"; exit 1; }
ls -la "$ck" | sed 's/^/  | /'
check_checkpoints "$ck" | grep -q "valid step-000000010.json" ||
  { check_checkpoints "$ck"; echo "FAIL: the previous checkpoint (step 10) is not valid"; exit 1; }
check_checkpoints "$ck" > /dev/null || { echo "FAIL: a torn file under a checkpoint's name"; exit 1; }
ls "$ck" | grep -q "step-000000020" && { echo "FAIL: files of the failed step-20 write were left"; exit 1; }

mount -o remount,size=32m "$disk" || { echo "FAIL: cannot grow the tmpfs"; exit 1; }
train_expect 0 "$out/log2" "${sets[@]}" --resume "$disk/run"
grep "^resum" "$out/log2" | sed 's/^/  | /'
grep -qE "resuming .*/step-000000010\.safetensors: epoch 1, batch 10, step 10" "$out/log2" ||
  { echo "FAIL: did not resume from the step-10 checkpoint"; exit 1; }
grep -q "done after epoch 1" "$out/log2" || { echo "FAIL: the resumed run did not finish"; exit 1; }
echo "PASS: ENOSPC while checkpointing: named error, step 10 kept valid, resumed from it"
