#!/usr/bin/env bash
# The disk fills while a run writes its logs (ENOSPC), on a real small file
# system (a tmpfs), in two ways:
#  A. mid-run, before any checkpoint: the run must fail naming the log file
#     and the lack of space, saying that there is no checkpoint to go on
#     from, and leave every log whole (steps.csv and metrics.csv end with a
#     whole row, the TensorBoard file with a whole record);
#  B. at the start of a --resume: the error names the checkpoint step that
#     --resume continues from and the logs stay whole; once there is room
#     again, --resume finishes, and steps.csv holds each step's row once.
# Needs root (mount): skips (77) when mount is not permitted.
#   usage: log_enospc_test.sh CNNFLOW_BINARY
set -u
source "$(dirname "$0")/fault_lib.sh"
cnnflow="$1"
small_disk 5m
sets=(--set train.epochs=1 --set train.max_steps=60 --set train.log_every=1 --set threads=2)

# fill FILE: fills the tmpfs with FILE, then gives back $2 KiB of it.
fill() {
  dd if=/dev/zero of="$1" bs=4k 2>/dev/null
  truncate -s "-${2}k" "$1"
}

# Every log of run folder $1 is whole: steps.csv and metrics.csv are lines of
# their header's field count, each ending in a newline, steps.csv's train rows
# in step order; the events file is a sequence of whole TFRecords. Prints the
# last train step in steps.csv.
check_logs() {
  python3 - "$1" <<'PY'
import glob, os, struct, sys
d = sys.argv[1]
bad = []
last = 0
for name in ("steps.csv", "metrics.csv"):
    p = os.path.join(d, name)
    if not os.path.exists(p):
        continue
    text = open(p).read()
    if text and not text.endswith("\n"):
        bad.append(f"{name} ends inside a row: {text[-40:]!r}")
    lines = text.splitlines()
    width = len(lines[0].split(",")) if lines else 0
    for i, line in enumerate(lines[1:], 2):
        if len(line.split(",")) != width:
            bad.append(f"{name} line {i} has {len(line.split(','))} fields, not {width}: {line!r}")
        elif name == "steps.csv" and line.split(",")[2]:
            step = int(line.split(",")[0])
            if step <= last:
                bad.append(f"steps.csv line {i}: step {step} after {last}")
            last = step
for p in glob.glob(os.path.join(d, "events.out.tfevents.*")):
    b = open(p, "rb").read()
    at = 0
    while at + 12 <= len(b):
        at += 16 + struct.unpack("<Q", b[at:at + 8])[0]
    if at != len(b):
        bad.append(f"{os.path.basename(p)}: {len(b)} bytes, a record is cut off at {min(at, len(b))}")
tmps = [n for n in os.listdir(d) if ".tmp" in n]
if tmps:
    bad.append(f"temporary files left: {tmps}")
for line in bad:
    print("BAD " + line, file=sys.stderr)
print(last)
sys.exit(1 if bad else 0)
PY
}

echo "A. the disk fills mid-run, before any checkpoint"
fill "$disk/filler" 16
train_expect 1 "$out/logA" "${sets[@]}" --out "$disk/a"
grep "error" "$out/logA" | sed 's/^/  | /'
grep -qE "error: .*cannot write '.*/a/(steps\.csv|metrics\.csv|events\.out\.tfevents[^']*)': No space left on device; no checkpoint had been written yet" "$out/logA" ||
  { echo "FAIL: the error does not name the log file, the lack of space and that no checkpoint exists"; exit 1; }
lastA=$(check_logs "$disk/a") || { echo "FAIL: a torn log file"; exit 1; }
echo "  steps.csv ends with the whole row of step $lastA"
(( lastA > 0 )) || { echo "FAIL: the run wrote no step row before the disk filled"; exit 1; }
rm -rf "$disk/filler" "$disk/a"

echo "B. the disk is full when a run is resumed"
mount -o remount,size=32m "$disk" || { echo "FAIL: cannot grow the tmpfs"; exit 1; }
CNNFLOW_TEST_FAULT="rank=0,step=25,mode=exit1" \
  train_expect 1 "$out/logB0" "${sets[@]}" --set train.checkpoint_every=10 --out "$disk/b"
cp "$disk/b/steps.csv" "$out/steps-before.csv"
fill "$disk/filler" 0
train_expect 1 "$out/logB1" "${sets[@]}" --set train.checkpoint_every=10 --resume "$disk/b"
grep "error" "$out/logB1" | sed 's/^/  | /'
grep -qE "error: .*cannot (write|create) '.*/b/[^']*': No space left on device; the checkpoints written before it are intact: --resume .*/b continues from the newest \(step 20\)" "$out/logB1" ||
  { echo "FAIL: the error does not name the file, the lack of space and the step to go on from"; exit 1; }
check_logs "$disk/b" > /dev/null || { echo "FAIL: a torn log file after the failed resume"; exit 1; }
rm -f "$disk/filler"
train_expect 0 "$out/logB2" "${sets[@]}" --set train.checkpoint_every=10 --resume "$disk/b"
grep "^resum" "$out/logB2" | sed 's/^/  | /'
lastB=$(check_logs "$disk/b") || { echo "FAIL: a torn log file after the resumed run"; exit 1; }
steps=$(awk -F, 'NR > 1 && $3 != "" { print $1 }' "$disk/b/steps.csv" | tr '\n' ' ')
[[ $steps == "$(seq -s ' ' 1 60) " ]] ||
  { echo "FAIL: steps.csv's train rows are not steps 1..60 once each: $steps"; exit 1; }
echo "PASS: ENOSPC while logging: named error, whole logs, resumed from step 20, each step logged once"
