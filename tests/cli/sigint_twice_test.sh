#!/usr/bin/env bash
# Ctrl-C twice: the first asks for a stop (finish the step, checkpoint), the
# second quits at once with exit 130 and leaves no torn file.
#  0. One Ctrl-C: the run stops after the step in flight.
#  A. The second Ctrl-C right after the first, while the step (a batch of
#     2048) is still running: the process must end within 1 s, without
#     finishing the step and saving ("quitting at once", not "stopped by a
#     signal").
#  B. The second Ctrl-C as soon as the stop's checkpoint file appears (while
#     it is being written or just after): exit 130 at once; every checkpoint
#     under a final name is whole and valid (a cut write leaves only a
#     *.tmp.PID file, which --resume ignores): checked as the loader checks
#     them, sizes and CRC-32 against the sidecars.
#   usage: sigint_twice_test.sh CNNFLOW_BINARY
set -u
source "$(dirname "$0")/fault_lib.sh"
cnnflow="$1"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sets=(--set train.epochs=1 --set train.batch=2048 --set train.max_steps=8 --set threads=1)
# No helper threads of OpenBLAS: they start before cnnflow can block the
# signals in them, and would take a second Ctrl-C that no cnnflow thread
# was left to take (the bug this test caught).
export OPENBLAS_NUM_THREADS=1
# start LOG ARGS...: cnnflow train in the background (pid), under a 60 s
# alarm of its own: `timeout` would stand between the signals and cnnflow.
start() {
  local log="$1"
  shift
  "$cnnflow" train configs/fashion_mnist.yaml "${sets[@]}" "$@" > "$log" 2>&1 &
  pid=$!
  (
    sleep 60 &
    trap 'kill $! 2> /dev/null; exit 0' TERM
    wait $!
    kill -KILL "$pid" 2> /dev/null
  ) > /dev/null 2>&1 &
  alarm=$!
}
# second_sigint LABEL LOG: the second Ctrl-C; the process must exit 130
# within 1 s (x slowdown). Sets elapsed.
second_sigint() {
  local t0=$EPOCHREALTIME status
  kill -INT "$pid"
  wait "$pid"
  status=$?
  elapsed=$(since "$t0")
  kill "$alarm" 2> /dev/null
  echo "$1: exit status $status, ${elapsed} s after the second Ctrl-C"
  [[ $status -eq 130 ]] || { cat "$2"; echo "FAIL: $1: exit status $status, expected 130"; exit 1; }
  awk -v e="$elapsed" -v s="$slowdown" 'BEGIN { exit !(e <= 1.0 * s) }' ||
    { echo "FAIL: $1: took ${elapsed} s to quit"; exit 1; }
}

# 0. One Ctrl-C stops after the step in flight (at most one more than the
# progress line showed), not after the batches already prefetched too (it
# took 4 more steps of 2048 images before).
start "$out/log.0" --out "$out/0"
for _ in $(seq 1 600); do grep -q "train epoch 1/1" "$out/log.0" 2>/dev/null && break; sleep 0.05; done
shown=$(grep -o "step [0-9]*/8" "$out/log.0" | tail -n 1 | grep -o "[0-9]*/" | tr -d /)
kill -INT "$pid"
wait "$pid"
status=$?
kill "$alarm" 2> /dev/null
stopped=$(grep -o "stopped by a signal in epoch 1 after [0-9]* steps" "$out/log.0" | grep -o "[0-9]* steps" | tr -dc 0-9)
echo "0: one Ctrl-C at step ${shown:-?}: stopped after ${stopped:-?} steps, exit status $status"
[[ $status -eq 130 && -n "$stopped" && -n "$shown" ]] || { cat "$out/log.0"; echo "FAIL: 0: no stop"; exit 1; }
((stopped <= shown + 2)) || { echo "FAIL: 0: trained $((stopped - shown)) steps past the Ctrl-C"; exit 1; }

# A: during the step.
start "$out/log.a" --out "$out/a"
for _ in $(seq 1 600); do grep -q "train epoch 1/1" "$out/log.a" 2>/dev/null && break; sleep 0.05; done
kill -INT "$pid"
for _ in $(seq 1 200); do grep -q "stopping: finishing the step" "$out/log.a" && break; sleep 0.01; done
second_sigint A "$out/log.a"
grep -q "second signal: quitting at once" "$out/log.a" || { cat "$out/log.a"; echo "FAIL: A: no 'quitting at once'"; exit 1; }
grep -q "stopped by a signal" "$out/log.a" && { echo "FAIL: A: the second Ctrl-C waited for the step and the checkpoint"; exit 1; }
if [[ -d "$out/a/checkpoints" ]]; then check_checkpoints "$out/a/checkpoints" || { echo "FAIL: A: torn checkpoint"; exit 1; }; fi

# B: while (or just after) the stop's checkpoint is written.
ck="$out/b/checkpoints"
start "$out/log.b" --set train.checkpoint_every=2 --out "$out/b"
for _ in $(seq 1 600); do [[ -e "$ck/step-000000002.json" ]] && break; sleep 0.05; done
[[ -e "$ck/step-000000002.json" ]] || { cat "$out/log.b"; echo "FAIL: B: no checkpoint at step 2"; exit 1; }
kill -INT "$pid"
# Spin (builtins only) until the next checkpoint's first file appears.
shopt -s nullglob
for _ in $(seq 1 2000000); do
  files=("$ck"/step-00000000[3-9]*)
  ((${#files[@]})) && break
  kill -0 "$pid" 2> /dev/null || break
done
echo "B: the second Ctrl-C when ${files[*]##*/} appeared"
second_sigint B "$out/log.b"
ls "$ck" | sed 's/^/  | /'
check_checkpoints "$ck" || { echo "FAIL: B: a torn file under a checkpoint's name"; exit 1; }
echo "PASS: the second Ctrl-C quit at once with 130, no torn checkpoint"
